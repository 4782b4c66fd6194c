-- Deferred start ids (see docs/deferred.md): the id of a debounce or batch
-- start lives in deferred_starts, not in runs, because the run it leads to
-- has an id of its own. Ordinary starts only look at runs, so without this
-- trigger an ordinary start could reuse such an id and make a second
-- resource answering to it.
--
-- The refusal is a unique_violation naming the constraint
-- runs_id_reserved_by_deferred_start, which the gateway answers with 409,
-- like any other reuse of an id with a different request. Only the insert
-- of a new run is looked at; the lookup is one probe of the primary key of
-- deferred_starts.
--
-- The check is exact because every path that writes runs or member starts
-- of a tenant takes that tenant's tenant_running row lock first (the start
-- committer, deferred.Accept and the firers): the two inserts cannot
-- interleave unseen.
CREATE OR REPLACE FUNCTION harvest_runs_reserve_deferred_ids() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM deferred_starts WHERE tenant = NEW.tenant AND id = NEW.id) THEN
        RAISE EXCEPTION 'id % of tenant % is taken by a deferred start', NEW.id, NEW.tenant
            USING ERRCODE = 'unique_violation',
                  CONSTRAINT = 'runs_id_reserved_by_deferred_start';
    END IF;
    RETURN NEW;
END
$$;

CREATE OR REPLACE TRIGGER runs_reserve_deferred_ids
    BEFORE INSERT ON runs
    FOR EACH ROW EXECUTE FUNCTION harvest_runs_reserve_deferred_ids();
