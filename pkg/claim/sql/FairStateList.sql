-- The fairness state rows (keys charged at least once) of every queue.
SELECT queue, key, pass, last_start, charged_at FROM fair_state
WHERE charged_at IS NOT NULL ORDER BY queue, key
