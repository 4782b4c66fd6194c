-- A run's status, without a lock: the cancel path picks its route by it
-- and checks it again under the locks it then takes.
SELECT status FROM runs WHERE tenant = $1 AND id = $2
