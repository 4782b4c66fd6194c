SELECT harvest_continue($1, $2, $3, $4,
       coalesce($5, CASE WHEN $6::bigint IS NULL THEN NULL ELSE coalesce($7, now()) + $6::bigint * interval '1 microsecond' END), $7)
