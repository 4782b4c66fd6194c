-- A run reached a final state: record it and release the tenant's slot, in
-- the caller's transaction. A run already final is left alone.
CREATE OR REPLACE FUNCTION harvest_run_finish(p_run_pk bigint, p_status text, p_output jsonb, p_error text) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_tenant text;
BEGIN
    UPDATE runs SET status = p_status, output = p_output, error = p_error, finished_at = now()
    WHERE pk = p_run_pk AND status NOT IN ('completed', 'failed', 'cancelled')
    RETURNING tenant INTO v_tenant;
    IF FOUND THEN
        UPDATE tenant_running SET running = running - 1 WHERE tenant = v_tenant AND running > 0;
    END IF;
END
$$;
