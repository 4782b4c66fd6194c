-- The run to cancel: its handle and status, without a lock. Locks are taken
-- task first, run second (the order of the claim and of completion), so a
-- cancel racing a claim cannot deadlock with it.
SELECT pk, status FROM runs WHERE tenant = $1 AND id = $2
