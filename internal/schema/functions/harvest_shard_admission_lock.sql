-- Take the shard's admission lock until the end of the transaction. Every
-- transaction that adds unfinished runs to the shard (a start group, a
-- single start, a deferred start or firing) takes it first, before any
-- other lock, so the starts of a shard are judged one transaction at a
-- time against a total that holds every committed start: no two groups
-- can each see room for the same last run, and the system limit is exact
-- on one shard. Runs that finish take no part: they only lower the count.
CREATE OR REPLACE FUNCTION harvest_shard_admission_lock() RETURNS void
LANGUAGE sql AS $$
    SELECT pg_advisory_xact_lock(1213346391, 0)
$$;
