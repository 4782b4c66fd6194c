-- The shard's capacity lease: how many unfinished runs it may hold (see
-- the admission_lease table). Read by every start after the shard's
-- admission lock, which every return of capacity takes too, so the value
-- a start is judged by cannot shrink before the start commits.
-- (PL/pgSQL, so that its plan is kept from call to call, as
-- harvest_shard_running's.)
CREATE OR REPLACE FUNCTION harvest_shard_lease() RETURNS bigint
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN coalesce((SELECT l.granted - l.returned FROM admission_lease AS l), 0);
END
$$;
