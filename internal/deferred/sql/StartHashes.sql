-- What an id is already used for, within the tenant: a member start of a
-- debounce window or batch, or a run (which may be a deferred run).
SELECT (SELECT request_hash FROM deferred_starts WHERE tenant = $1 AND id = $2) AS member_hash,
       (SELECT request_hash FROM runs WHERE tenant = $1 AND id = $2) AS run_hash
