-- Record several outcomes of leased tasks in one statement, each fenced by
-- its own token (harvest_outcome_batch). A retry time counts from the
-- database clock, as TaskFail's does; a continuation's due time and sticky
-- end from $12 or the database clock, as TaskContinue's due time does.
SELECT task_id, outcome, retried, next_id,
       run_id, run_tenant, run_name, run_queue, run_fairness_key, run_quota_key, run_priority, run_status,
       run_attempts, run_created_at, run_claimed_at, run_finished_at, run_output, run_error
FROM harvest_outcome_batch($1::text[], $2::bigint[], $3::uuid[], $4::jsonb[], $5::text[],
                           harvest_outcome_times($6::timestamptz[], $7::bigint[], now()),
                           harvest_outcome_times($8::timestamptz[], $9::bigint[], coalesce($12::timestamptz, now())),
                           harvest_outcome_times($10::timestamptz[], $11::bigint[], coalesce($12::timestamptz, now())),
                           $12::timestamptz)
