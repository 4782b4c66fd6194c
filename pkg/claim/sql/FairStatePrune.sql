-- Prune the fairness state of queue $1 (see harvest_fair_prune).
SELECT queue, key FROM harvest_fair_prune($1, $2, $3::bigint * interval '1 microsecond', $4)
