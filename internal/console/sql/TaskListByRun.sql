-- The tasks of run $1 (tasks_run_pk), oldest first: the newest $2 of
-- them, so that a run with a long chain of continuations shows its latest
-- tasks, the live one among them, on a page of bounded size.
SELECT id, step, state, attempt, claimed_by, claimed_at, due_at, created_at
FROM (
    SELECT id, step, state, attempt, claimed_by, claimed_at, due_at, created_at
    FROM tasks
    WHERE run_pk = $1
    ORDER BY id DESC
    LIMIT $2
) newest
ORDER BY id
