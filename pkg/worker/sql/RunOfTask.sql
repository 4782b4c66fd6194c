-- What the worker needs of a claimed task's run.
SELECT tenant, id, name, status, max_attempts, timeout_ms FROM runs WHERE pk = $1
