-- Runs of the tenant an earlier batch took off this shard and did not
-- finish moving (a crash between its steps): the next batch is these.
SELECT run_pk FROM move_out WHERE tenant = $1 ORDER BY run_pk LIMIT $2
