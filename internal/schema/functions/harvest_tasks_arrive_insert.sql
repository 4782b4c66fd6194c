-- New pending rows are announced once per statement and key, not once per
-- row: a group of starts of one key appends one arrival, its first row in
-- the claim order.
CREATE OR REPLACE FUNCTION harvest_tasks_arrive_insert() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO fair_arrivals (queue, key, head_id, head_prio, head_cont, head_due)
    SELECT DISTINCT ON (a.queue, a.fairness_key)
           a.queue, a.fairness_key, a.id, a.priority, a.continuation, a.due_at
    FROM added AS a
    WHERE a.state = 'pending'
    ORDER BY a.queue, a.fairness_key, a.priority DESC, a.continuation DESC, a.due_at, a.id;
    RETURN NULL;
END
$$;

CREATE OR REPLACE TRIGGER tasks_arrive_insert
    AFTER INSERT ON tasks
    REFERENCING NEW TABLE AS added
    FOR EACH STATEMENT EXECUTE FUNCTION harvest_tasks_arrive_insert();
