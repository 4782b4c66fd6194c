SELECT queue, key FROM harvest_fair_prune($1, $2::bigint * interval '1 microsecond', $3)
