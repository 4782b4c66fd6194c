-- The quotas of the tenant's quota keys ($1, sub-key pattern $2), as JSON.
SELECT coalesce(jsonb_agg(to_jsonb(q) ORDER BY q.queue, q.quota_key), '[]'::jsonb)
FROM quotas q
WHERE q.quota_key = $1 OR q.quota_key LIKE $2 ESCAPE '\'
