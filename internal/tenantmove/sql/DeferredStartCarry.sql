-- Write member starts (JSON rows of DeferredStartRead) under their group's
-- pk on this shard, found by the group's run id; rows that exist stay.
WITH src AS (
    SELECT jsonb_populate_record(NULL::deferred_starts, e) AS s, e ->> 'run_id' AS run_id
    FROM jsonb_array_elements($1::jsonb) AS e
)
INSERT INTO deferred_starts (tenant, id, group_pk, position, request_hash, accepted_at)
SELECT (x.s).tenant, (x.s).id, g.pk, (x.s).position, (x.s).request_hash, (x.s).accepted_at
FROM src x
JOIN deferred_groups g ON g.tenant = (x.s).tenant AND g.run_id = x.run_id
ON CONFLICT DO NOTHING
