-- A run reached a final state: record it and release the tenant's slot, in
-- the caller's transaction. A run already final is left alone.
--
-- p_ended is the number of the run's attempts that end with it and were
-- not counted yet (the claim does not count them: a rescue that fails the
-- run on an expired lease passes 1, a cancel the running tasks it took
-- out), p_claimed_at the earliest claim time among them, kept as the run's
-- first when it has none. So a final run stores what runs_seen showed just
-- before, and is read as stored from then on. A caller that ends no
-- attempt (a deferred start cancelled, a binary of the previous release)
-- leaves both out.
DROP FUNCTION IF EXISTS harvest_run_finish(bigint, text, jsonb, text);
CREATE OR REPLACE FUNCTION harvest_run_finish(p_run_pk bigint, p_status text, p_output jsonb, p_error text,
                                              p_ended integer DEFAULT 0, p_claimed_at timestamptz DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_tenant text;
BEGIN
    UPDATE runs SET status = p_status, output = p_output, error = p_error, finished_at = now(),
                    attempts = attempts + coalesce(p_ended, 0),
                    claimed_at = CASE WHEN coalesce(p_ended, 0) > 0 THEN coalesce(claimed_at, p_claimed_at)
                                      ELSE claimed_at END
    WHERE pk = p_run_pk AND status NOT IN ('completed', 'failed', 'cancelled')
    RETURNING tenant INTO v_tenant;
    IF FOUND THEN
        UPDATE tenant_running SET running = running - 1 WHERE tenant = v_tenant AND running > 0;
    END IF;
END
$$;
