-- A start group: harvest_start_group decides and writes it, one row per
-- start in the order sent. $1 to $14 are the starts' arrays (tenants, ids,
-- names, queues, fairness keys, quota keys, priorities, inputs as JSON
-- text, request hashes, max attempts, timeouts in ms, run_at, delays in
-- microseconds, trace contexts as JSON text); $15 the starts a Go hook
-- refused (NULL: none); $16 to $22 the rule (tenantcap.Rule.Params; $16
-- NULL: admit every start); $23 refuses every new run.
SELECT g.ord, g.outcome, g.reason, g.run_pk, g.task_id, g.due, g.busy, g.own, g.shard, g.lease, g.scheduled,
       g.moved_to, g.err_code, g.err_message, g.err_constraint, g.created_at
FROM harvest_start_group($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15,
                         $16, $17, $18, $19, $20, $21, $22, $23) AS g
