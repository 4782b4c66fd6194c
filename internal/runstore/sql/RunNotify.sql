-- Ask for the announcement of run $2 of tenant $1 when it ends
-- (runs.notify), unless it is final already or asks for it already. A
-- final run is left alone: the caller reads it next and sees it final.
-- The update takes the run's row lock, so an outcome that makes the run
-- final either committed before (and the caller's read sees it final) or
-- reads the row after this commits (and announces it).
UPDATE runs SET notify = true
WHERE tenant = $1 AND id = $2 AND NOT notify AND finished_at IS NULL
