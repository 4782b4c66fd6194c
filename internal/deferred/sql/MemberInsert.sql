-- Record a start of a debounce window or batch under its own id.
INSERT INTO deferred_starts (tenant, id, group_pk, position, request_hash, accepted_at)
VALUES ($1, $2, $3, $4, $5, $6)
