-- Remove the waiting run so the real run can take its id.
DELETE FROM runs WHERE pk = $1 AND status = 'deferred'
