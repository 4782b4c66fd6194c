-- Does the queue hold a due pending task other than $2? (A dispatch of $2
-- is then claimed fairly instead of by id.) Read as the first row of the
-- pending order index rather than as EXISTS, so that no plan reads the
-- table for it (harvest_queue_pending says why).
SELECT (SELECT id FROM tasks
        WHERE queue = $1 AND state = 'pending' AND due_at <= now() AND id <> $2
        ORDER BY priority DESC, continuation DESC, due_at, id
        LIMIT 1) IS NOT NULL
