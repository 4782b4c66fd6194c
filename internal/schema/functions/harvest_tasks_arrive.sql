-- A task row became pending, or a pending row moved in the claim order
-- (an update of its queue, key, priority, band or due time): announce it
-- to the fair claimers of its queue. The trigger's WHEN clause keeps every
-- other update (a lease, a completion, a heartbeat) from calling in here,
-- so claims and completions pay nothing for it. Rows that stop being
-- pending are not announced: a fair claim finds out when it checks the
-- head of the key it picked.
CREATE OR REPLACE FUNCTION harvest_tasks_arrive() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO fair_arrivals (queue, key, head_id, head_prio, head_cont, head_due)
    VALUES (NEW.queue, NEW.fairness_key, NEW.id, NEW.priority, NEW.continuation, NEW.due_at);
    RETURN NULL;
END
$$;

CREATE OR REPLACE TRIGGER tasks_arrive
    AFTER UPDATE OF state, queue, fairness_key, priority, continuation, due_at ON tasks
    FOR EACH ROW
    WHEN (NEW.state = 'pending'
          AND (OLD.state <> 'pending'
               OR (OLD.queue, OLD.fairness_key, OLD.priority, OLD.continuation, OLD.due_at)
                  IS DISTINCT FROM (NEW.queue, NEW.fairness_key, NEW.priority, NEW.continuation, NEW.due_at)))
    EXECUTE FUNCTION harvest_tasks_arrive();
