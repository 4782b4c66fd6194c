-- Move the slots of waiting throttled starts ($1 pks, $2 times).
UPDATE deferred_groups g SET fires_at = u.fires_at
FROM unnest($1::bigint[], $2::timestamptz[]) AS u (pk, fires_at)
WHERE g.pk = u.pk AND g.fires_at <> u.fires_at
