-- Withdraw worker $1 from the queues $2 at a clean stop.
DELETE FROM worker_presence WHERE worker = $1 AND queue = ANY ($2::text[])
