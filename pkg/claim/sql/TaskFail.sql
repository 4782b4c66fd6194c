SELECT harvest_fail($1, $2, $3, coalesce($4, CASE WHEN $5::bigint IS NULL THEN NULL ELSE now() + $5::bigint * interval '1 microsecond' END), $6)
