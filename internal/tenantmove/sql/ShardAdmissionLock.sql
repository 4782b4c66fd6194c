-- The shard's admission lock, in a statement of its own so that the
-- statements after it read with snapshots taken once it is held.
SELECT harvest_shard_admission_lock()
