-- Take the shard's admission lock (harvest_shard_admission_lock) if no
-- other transaction holds it, without waiting. A gateway giving back
-- another shard's unused capacity uses it: that shard's starts may be
-- waiting on this gateway for capacity, so waiting on them could deadlock
-- across databases, where no deadlock detector sees both sides.
CREATE OR REPLACE FUNCTION harvest_shard_admission_try_lock() RETURNS boolean
LANGUAGE sql AS $$
    SELECT pg_try_advisory_xact_lock(1213346391, 0)
$$;
