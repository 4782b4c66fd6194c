-- Does the queue hold a due pending task other than $2? (A dispatch of $2
-- is then claimed fairly instead of by id.) Read as one row of the pending
-- order index, from the back, rather than as EXISTS: no plan can then read
-- the table for it, and the entries of rows claimed since the last vacuum
-- (at the front) are not on its way (harvest_queue_pending says why).
SELECT (SELECT id FROM tasks
        WHERE queue = $1 AND state = 'pending' AND due_at <= now() AND id <> $2
        ORDER BY priority, continuation, due_at DESC, id DESC
        LIMIT 1) IS NOT NULL
