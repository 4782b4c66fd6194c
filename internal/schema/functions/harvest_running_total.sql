-- Keep the shard's count of unfinished runs (shard_running, migration
-- 0012) equal to sum(tenant_running.running) whatever changes a tenant's
-- count: a start, a finish, a cancel, a retry, a deferred hold or
-- release, a move, a recount, a test's factory. A rise goes to stripe 0,
-- a fall to the tenant's stripe (harvest_running_stripe).
--
-- Row triggers run at the end of their statement, after it took its
-- tenant rows, so a statement takes tenant rows first and stripe rows
-- second. A transaction that lowers the counts of several tenants in
-- several statements takes their rows and stripes first, in order
-- (harvest_running_lock); otherwise two of them could each hold the
-- stripe the other needs next.
CREATE OR REPLACE FUNCTION harvest_running_total() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    v_delta bigint := coalesce(NEW.running, 0)::bigint - coalesce(OLD.running, 0)::bigint;
BEGIN
    IF v_delta > 0 THEN
        UPDATE shard_running SET added = added + v_delta WHERE stripe = 0;
    ELSIF v_delta < 0 THEN
        UPDATE shard_running SET removed = removed - v_delta
        WHERE stripe = harvest_running_stripe(coalesce(OLD.tenant, NEW.tenant));
    END IF;
    RETURN NULL;
END
$$;

CREATE OR REPLACE TRIGGER tenant_running_total_insert
    AFTER INSERT ON tenant_running
    FOR EACH ROW
    WHEN (NEW.running <> 0)
    EXECUTE FUNCTION harvest_running_total();

CREATE OR REPLACE TRIGGER tenant_running_total_update
    AFTER UPDATE ON tenant_running
    FOR EACH ROW
    WHEN (OLD.running IS DISTINCT FROM NEW.running)
    EXECUTE FUNCTION harvest_running_total();

CREATE OR REPLACE TRIGGER tenant_running_total_delete
    AFTER DELETE ON tenant_running
    FOR EACH ROW
    WHEN (OLD.running <> 0)
    EXECUTE FUNCTION harvest_running_total();
