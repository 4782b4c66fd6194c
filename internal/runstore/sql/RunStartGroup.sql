-- A start group: harvest_start_group decides and writes it, one row per
-- start in the order sent. $1 to $14 are the starts' arrays (tenants, ids,
-- names, queues, fairness keys, quota keys, priorities, inputs as JSON
-- text, request hashes, max attempts, timeouts in ms, run_at, delays in
-- microseconds, trace contexts as JSON text); $15 the starts a Go hook
-- refused (NULL: none); $16 to $22 the rule (tenantcap.Rule.Params; $16
-- NULL: admit every start); $23 refuses every new run; $24 whether each
-- start's run is announced when it ends (runs.notify).
-- What does not apply to a start comes back as zero or '', not NULL.
SELECT g.ord, g.outcome, coalesce(g.reason, '') AS reason, coalesce(g.run_pk, 0) AS run_pk,
       coalesce(g.task_id, 0) AS task_id, coalesce(g.due, false) AS due, coalesce(g.busy, false) AS busy,
       coalesce(g.own, 0) AS own, coalesce(g.shard, 0) AS shard, coalesce(g.lease, 0) AS lease,
       coalesce(g.scheduled, 0) AS scheduled, coalesce(g.moved_to, 0) AS moved_to,
       coalesce(g.err_code, '') AS err_code, coalesce(g.err_message, '') AS err_message,
       coalesce(g.err_constraint, '') AS err_constraint, g.created_at
FROM harvest_start_group($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15,
                         $16, $17, $18, $19, $20, $21, $22, $23, $24) AS g
