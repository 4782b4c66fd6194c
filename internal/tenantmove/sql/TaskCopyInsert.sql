-- Write the tasks (JSON rows of TaskCopyRead) of the runs written now ($2
-- their ids, $3 their new pks): a moving task claimable again here,
-- pending when due, else scheduled; a done one as it was, with who
-- claimed it and when. The sticky pin and the lease stay behind: the old
-- home's workers are not this shard's. The insert trigger records the
-- pending ones as arrivals for the fair claim.
WITH src AS (
    SELECT jsonb_populate_record(NULL::tasks, e) AS t, e ->> 'run_id' AS run_id
    FROM jsonb_array_elements($1::jsonb) AS e
), m AS (
    SELECT id, pk FROM unnest($2::text[], $3::bigint[]) AS m (id, pk)
)
INSERT INTO tasks (run_pk, queue, fairness_key, quota_key, priority, continuation, state, due_at,
                   step, input, attempt, trace_context, created_at, claimed_by, claimed_at)
SELECT m.pk, (s.t).queue, (s.t).fairness_key, (s.t).quota_key, (s.t).priority, (s.t).continuation,
       CASE WHEN (s.t).state = 'done' THEN 'done' WHEN (s.t).due_at <= now() THEN 'pending' ELSE 'scheduled' END,
       (s.t).due_at, (s.t).step, (s.t).input, (s.t).attempt, (s.t).trace_context, (s.t).created_at,
       CASE WHEN (s.t).state = 'done' THEN (s.t).claimed_by END,
       CASE WHEN (s.t).state = 'done' THEN (s.t).claimed_at END
FROM src s
JOIN m ON m.id = s.run_id
ORDER BY (s.t).id
