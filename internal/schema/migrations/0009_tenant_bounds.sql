-- Two bounds on what one tenant can do to the others.
--
-- tenant_priority: the highest priority each tenant's starts may carry,
-- where an operator set one (shard 0 holds the cluster's rows, as it holds
-- the admission configuration; the table exists on every shard because
-- every shard has the same schema). A tenant without a row may not start
-- runs above the default priority, 0: priority sorts before the fair
-- order, so a tenant free to pick 1000 would take every other tenant's
-- claims.
CREATE TABLE tenant_priority (
    tenant       text        PRIMARY KEY,
    max_priority integer     NOT NULL CHECK (max_priority BETWEEN -1000 AND 1000),
    updated_at   timestamptz NOT NULL DEFAULT now(),
    updated_by   text        NOT NULL DEFAULT ''
);

-- runs.not_before: when a run started with run_at or delay falls due; NULL
-- for a run due at its start, which is nearly every run, so those rows
-- never enter the index below and their starts write nothing more.
-- A run not due yet counts against its tenant's limits like any unfinished
-- run, but a tenant may hold only a share of its limit that way
-- (docs/admission.md): the count of such runs is read through this index
-- under the tenant's count row lock. No hot column is in the index or its
-- predicate besides finished_at, which the unfinished-run index already
-- keys on, so a claim's update of a run stays a HOT update.
ALTER TABLE runs ADD COLUMN not_before timestamptz;
CREATE INDEX runs_not_due ON runs (tenant, not_before) WHERE not_before IS NOT NULL AND finished_at IS NULL;
