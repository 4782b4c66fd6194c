-- Does the queue hold a due pending task other than $2? (A dispatch of $2
-- is then claimed fairly instead of by id.)
SELECT EXISTS (SELECT 1 FROM tasks
               WHERE queue = $1 AND state = 'pending' AND due_at <= now() AND id <> $2)
