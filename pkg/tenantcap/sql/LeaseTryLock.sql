-- The shard's admission lock, if free (harvest_shard_admission_try_lock).
SELECT harvest_shard_admission_try_lock()
