-- The shard's capacity lease: how many unfinished runs it may hold (see
-- the admission_lease table). Read by every start after the shard's
-- admission lock, which every return of capacity takes too, so the value
-- a start is judged by cannot shrink before the start commits.
CREATE OR REPLACE FUNCTION harvest_shard_lease() RETURNS bigint
LANGUAGE sql STABLE AS $$
    SELECT coalesce((SELECT granted - returned FROM admission_lease), 0)
$$;
