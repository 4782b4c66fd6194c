-- Runs $1 as JSON rows, every column.
SELECT coalesce(jsonb_agg(to_jsonb(r) ORDER BY r.pk), '[]'::jsonb)
FROM runs r
WHERE r.pk = ANY ($1::bigint[])
