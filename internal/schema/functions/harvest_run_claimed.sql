-- The run of a row that harvest_claim_step has just leased, as the claim
-- hands it back to the worker: read, not written (the claim writes only
-- its task row, so it takes no lock on the run either). It is the run as
-- runs_seen shows it once the lease is visible: an unfinished run (stored
-- 'queued', or 'running' between the steps of a continued run) reads
-- running, with this attempt counted and, when no attempt of it has ended
-- yet, this task's claim time (p_claimed_at, the task's stamp) as its
-- first; a run that is final already (cancelled while its task waited) is
-- handed back as it is, so that the worker drops the task. The outcome
-- that ends the attempt writes what the claim used to (attempts and the
-- first claim time: harvest_outcome_batch). The bulk and lone steps do the
-- same for many rows at once (harvest_lease_rows).
CREATE OR REPLACE FUNCTION harvest_run_claimed(p_run_pk bigint, p_claimed_at timestamptz)
RETURNS runs
LANGUAGE plpgsql STABLE AS $$
DECLARE
    r_run runs;
BEGIN
    SELECT * INTO r_run FROM runs WHERE pk = p_run_pk;
    IF r_run.status IN ('queued', 'running') THEN
        r_run.status     := 'running';
        r_run.attempts   := r_run.attempts + 1;
        r_run.claimed_at := coalesce(r_run.claimed_at, p_claimed_at);
    END IF;
    RETURN r_run;
END
$$;
