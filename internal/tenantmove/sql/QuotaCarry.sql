-- Copy quotas (JSON rows of QuotaOfTenant) unless the key has one here.
INSERT INTO quotas (queue, quota_key, max_concurrent, rate, burst, updated_at, updated_by)
SELECT queue, quota_key, max_concurrent, rate, burst, updated_at, updated_by
FROM jsonb_populate_recordset(NULL::quotas, $1::jsonb)
ON CONFLICT (queue, quota_key) DO NOTHING
