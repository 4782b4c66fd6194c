-- Finish several leased tasks in one statement, each fenced by its token.
SELECT task_id, outcome FROM harvest_complete_batch($1::bigint[], $2::uuid[], $3::jsonb[])
