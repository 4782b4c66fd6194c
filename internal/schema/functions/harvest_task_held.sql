-- When an attempt billed by runtime leaves running (completed, failed,
-- retried, rescued, cancelled, moved: whatever statement does it), record
-- the worker time it held in fair_held for the next fair claim to settle.
-- The time runs from the claim to now on the database clock, capped at the
-- lease's expiry: a rescued task is billed the lease it held, and a worker
-- that finishes after its lease ran out is billed no more than that. The
-- trigger's condition keeps it off every task of a queue charged per claim
-- (charged_secs NULL), so those pay nothing for it.
CREATE OR REPLACE FUNCTION harvest_task_held() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO fair_held (task_id, queue, key, secs, billed)
    VALUES (OLD.id, OLD.queue, OLD.fairness_key,
            harvest_secs(greatest(harvest_us(least(clock_timestamp(), coalesce(OLD.lease_expires_at, clock_timestamp())),
                                             OLD.claimed_at), 0)),
            OLD.charged_secs);
    RETURN NULL;
END
$$;

CREATE OR REPLACE TRIGGER tasks_held
    AFTER UPDATE OF state ON tasks
    FOR EACH ROW
    WHEN (OLD.charged_secs IS NOT NULL AND OLD.state = 'running' AND NEW.state <> 'running'
          AND OLD.claimed_at IS NOT NULL)
    EXECUTE FUNCTION harvest_task_held();
