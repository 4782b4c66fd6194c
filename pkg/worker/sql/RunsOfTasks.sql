-- What the worker needs of the runs of a batch of claimed tasks.
SELECT pk, tenant, id, name, status, max_attempts, timeout_ms FROM runs WHERE pk = ANY ($1::bigint[])
