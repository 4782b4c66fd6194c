-- The recount compares each tenant's running count with its unfinished runs
-- on every janitor tick. This index keeps that read proportional to the
-- unfinished runs, not to every run kept for the retention period.
CREATE INDEX runs_unfinished_tenant ON runs (tenant)
    WHERE status NOT IN ('completed', 'failed', 'cancelled');
