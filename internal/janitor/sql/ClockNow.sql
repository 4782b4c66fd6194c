-- The database clock, which the deferred prune judges by.
SELECT now()
