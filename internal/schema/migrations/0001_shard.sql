-- The tables of one shard. Every shard holds the same schema; cluster-wide
-- settings (admission) are read from shard 0 only.

-- runs: one row per workflow run. The id is the caller's idempotency key and
-- is unique per tenant; pk is the internal handle that tasks point at.
CREATE TABLE runs (
    pk            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant        text        NOT NULL,
    id            text        NOT NULL,
    name          text        NOT NULL,
    queue         text        NOT NULL,
    fairness_key  text        NOT NULL DEFAULT '',
    quota_key     text        NOT NULL DEFAULT '',
    priority      integer     NOT NULL DEFAULT 0 CHECK (priority BETWEEN -1000 AND 1000),
    input         jsonb,
    -- request_hash identifies the start request, so a replay with the same
    -- id can be told apart from a conflicting one without comparing JSON.
    request_hash  bytea       NOT NULL,
    status        text        NOT NULL DEFAULT 'queued'
                  CHECK (status IN ('deferred', 'queued', 'running', 'completed', 'failed', 'cancelled')),
    attempts      integer     NOT NULL DEFAULT 0,
    max_attempts  integer     NOT NULL DEFAULT 3 CHECK (max_attempts >= 1),
    timeout_ms    bigint      CHECK (timeout_ms > 0),
    output        jsonb,
    error         text,
    created_at    timestamptz NOT NULL DEFAULT now(),
    claimed_at    timestamptz,
    finished_at   timestamptz,
    UNIQUE (tenant, id)
);

-- Listing a tenant's runs newest first, with cursor paging on pk.
CREATE INDEX runs_tenant_pk ON runs (tenant, pk DESC);
-- Retention deletes finished runs by age.
CREATE INDEX runs_finished_at ON runs (finished_at) WHERE finished_at IS NOT NULL;

-- tasks: the unit a worker claims. A run starts with one task; a handler may
-- continue the run with another (continuation = true).
CREATE TABLE tasks (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    run_pk           bigint      NOT NULL REFERENCES runs (pk) ON DELETE CASCADE,
    queue            text        NOT NULL,
    fairness_key     text        NOT NULL DEFAULT '',
    quota_key        text        NOT NULL DEFAULT '',
    priority         integer     NOT NULL DEFAULT 0,
    continuation     boolean     NOT NULL DEFAULT false,
    -- scheduled: waiting for due_at (kept out of the claim's indexes);
    -- pending: due and claimable; running: leased to a worker; done: finished.
    -- Rows go from scheduled to pending through harvest_promote_due, which
    -- every claim also runs for its queue.
    state            text        NOT NULL DEFAULT 'pending'
                     CHECK (state IN ('scheduled', 'pending', 'running', 'done')),
    due_at           timestamptz NOT NULL DEFAULT now(),
    sticky_worker    text,
    sticky_until     timestamptz,
    step             integer     NOT NULL DEFAULT 0,
    input            jsonb,
    attempt          integer     NOT NULL DEFAULT 0,
    lease_token      uuid,
    lease_expires_at timestamptz,
    claimed_by       text,
    claimed_at       timestamptz,
    -- W3C trace context of the start, so claim and execution spans link back.
    trace_context    jsonb,
    created_at       timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX tasks_run_pk ON tasks (run_pk);
-- Lease rescue scans running tasks by expiry.
CREATE INDEX tasks_lease_expiry ON tasks (lease_expires_at) WHERE state = 'running';
-- Concurrency caps count the running tasks of a quota key.
CREATE INDEX tasks_running_quota ON tasks (queue, quota_key) WHERE state = 'running';
-- The ordinary claim order of a queue (without ageing): a claim reads the
-- first unlocked entry.
CREATE INDEX tasks_pending_order ON tasks (queue, priority DESC, continuation DESC, due_at, id)
    WHERE state = 'pending';
-- The same order inside one fairness key: the fair claim takes the head of
-- the key it chose from here, and the key summary is refreshed from it.
CREATE INDEX tasks_pending_key ON tasks (queue, fairness_key, priority DESC, continuation DESC, due_at, id)
    WHERE state = 'pending';
-- Rows pinned to a worker are rare; the claim probes them separately.
CREATE INDEX tasks_pending_sticky ON tasks (queue, sticky_worker)
    WHERE state = 'pending' AND sticky_worker IS NOT NULL;
-- Promotion of scheduled rows once they are due.
CREATE INDEX tasks_scheduled_due ON tasks (queue, due_at) WHERE state = 'scheduled';

-- fair_state: one row per (queue, fairness key) that has due pending work or
-- has been charged. It carries two things:
--   * the start-time fair queuing state (pass, last_start, charged_at), NULL
--     until the key's first fair charge: such a row counts as "no state";
--   * a summary of the key's due pending rows (pending count and the head:
--     the first row in the claim order within the key), kept exact by the
--     trigger on tasks, so the fair claim chooses a key without reading the
--     backlog.
-- in_debt caches pass > V (V = the queue's largest last_start). A charge sets
-- it on the charged key and clears it on the keys that the new V overtakes;
-- each key is cleared at most once per own charge.
CREATE TABLE fair_state (
    queue      text             NOT NULL,
    key        text             NOT NULL,
    pass       double precision,
    last_start double precision,
    charged_at timestamptz,
    in_debt    boolean          NOT NULL DEFAULT false,
    pending    integer          NOT NULL DEFAULT 0,
    head_id    bigint,
    head_prio  integer,
    head_cont  boolean,
    head_due   timestamptz,
    PRIMARY KEY (queue, key),
    CHECK ((pass IS NULL) = (charged_at IS NULL) AND (pass IS NULL) = (last_start IS NULL))
);

-- Probe for the best key without debt (lag 0): by its head.
CREATE INDEX fair_state_free ON fair_state (queue, head_prio DESC, head_cont DESC, head_due, head_id)
    WHERE head_id IS NOT NULL AND NOT in_debt;
-- Probe for the best key in debt: by head priority, then pass (the lag).
CREATE INDEX fair_state_debt ON fair_state (queue, head_prio DESC, pass, head_cont DESC, head_due, head_id)
    WHERE head_id IS NOT NULL AND in_debt;
-- Keys whose debt a clock advance may clear.
CREATE INDEX fair_state_debt_pass ON fair_state (queue, pass) WHERE in_debt;
-- The queue clock V and the clock row.
CREATE INDEX fair_state_clock ON fair_state (queue, last_start DESC, key COLLATE "C" DESC)
    WHERE charged_at IS NOT NULL;

-- weight_overrides: per-key weights; a key without a row weighs 1.
CREATE TABLE weight_overrides (
    queue      text             NOT NULL,
    key        text             NOT NULL CHECK (key <> ''),
    weight     double precision NOT NULL CHECK (weight >= 0.001 AND weight <= 1000),
    updated_at timestamptz      NOT NULL DEFAULT now(),
    updated_by text             NOT NULL DEFAULT '',
    PRIMARY KEY (queue, key)
);

-- quotas: the post-claim rechecks of a (queue, quota key).
CREATE TABLE quotas (
    queue          text             NOT NULL,
    quota_key      text             NOT NULL CHECK (quota_key <> ''),
    max_concurrent integer          CHECK (max_concurrent > 0),
    rate           double precision CHECK (rate > 0),
    burst          double precision CHECK (burst >= 1),
    updated_at     timestamptz      NOT NULL DEFAULT now(),
    updated_by     text             NOT NULL DEFAULT '',
    PRIMARY KEY (queue, quota_key),
    CHECK ((rate IS NULL) = (burst IS NULL))
);

-- rate_buckets: token buckets of quotas with a rate; a bucket starts full.
CREATE TABLE rate_buckets (
    queue      text             NOT NULL,
    quota_key  text             NOT NULL,
    tokens     double precision NOT NULL,
    updated_at timestamptz      NOT NULL,
    PRIMARY KEY (queue, quota_key)
);

-- tenant_running: unfinished runs per tenant, changed in the same
-- transaction as the run itself so it never drifts.
CREATE TABLE tenant_running (
    tenant  text    PRIMARY KEY,
    running integer NOT NULL DEFAULT 0 CHECK (running >= 0)
);

-- settings: cluster-wide configuration (read from shard 0).
CREATE TABLE settings (
    name       text        PRIMARY KEY,
    value      jsonb       NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now(),
    updated_by text        NOT NULL DEFAULT ''
);

-- audit: every administrative change and every refused one.
CREATE TABLE audit (
    id        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at        timestamptz NOT NULL DEFAULT now(),
    actor     text        NOT NULL,
    action    text        NOT NULL,
    queue     text,
    key       text,
    old_value jsonb,
    new_value jsonb,
    outcome   text        NOT NULL,
    message   text        NOT NULL DEFAULT ''
);

CREATE INDEX audit_at ON audit (at DESC, id DESC);
