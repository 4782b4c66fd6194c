-- How many keys of the tenant ($1, sub-key pattern $2) have fairness state.
SELECT count(*)::bigint FROM fair_state WHERE key = $1 OR key LIKE $2 ESCAPE '\'
