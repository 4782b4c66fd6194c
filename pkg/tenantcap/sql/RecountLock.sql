-- Lock the running-count rows to fix ($1; NULL: every row) in a fixed order,
-- so no start or finish changes a count between the recount and its write.
SELECT tenant FROM tenant_running
WHERE $1::text[] IS NULL OR tenant = ANY($1)
ORDER BY tenant FOR UPDATE
