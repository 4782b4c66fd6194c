-- Deferred groups $1 as JSON rows, every column.
SELECT coalesce(jsonb_agg(to_jsonb(g) ORDER BY g.pk), '[]'::jsonb)
FROM deferred_groups g WHERE g.pk = ANY ($1::bigint[])
