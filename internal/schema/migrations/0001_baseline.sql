-- The tables, types and indexes of one shard. Every shard holds the same
-- schema; cluster-wide settings (admission) are read from shard 0 only.
--
-- Functions and triggers are not here: each lives in its own file under
-- functions/, and the migrator applies them after the migrations, every
-- time their text changed (see internal/schema).

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
) WITH (fillfactor = 90);
-- Room on each page lets the claim's update of a run (status, attempts,
-- claimed_at: no indexed column) stay on its page without new index
-- entries. finished_at, set with every final status, is what the
-- unfinished-run index below keys on, for the same reason.

-- Listing a tenant's runs newest first, with cursor paging on pk.
CREATE INDEX runs_tenant_pk ON runs (tenant, pk DESC);
-- Retention deletes finished runs by age.
CREATE INDEX runs_finished_at ON runs (finished_at) WHERE finished_at IS NOT NULL;
-- The recount compares each tenant's running count with its unfinished
-- runs on every janitor tick; this keeps that read proportional to the
-- unfinished runs, not to every run kept for the retention period.
CREATE INDEX runs_unfinished_tenant ON runs (tenant) WHERE finished_at IS NULL;

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
) WITH (autovacuum_vacuum_scale_factor = 0.02, autovacuum_analyze_scale_factor = 0.02);

CREATE INDEX tasks_run_pk ON tasks (run_pk);
-- Lease rescue scans running tasks by expiry. Only a running task has a
-- lease expiry (every way out of running clears it). The predicate names the
-- expiry, not the state, on purpose: a statement that looks running tasks up
-- by id (a completion batch) must not be planned as a scan of this index,
-- which its statistics, taken when few tasks run, make look free, and which
-- holds an entry for every task that ran since the last vacuum.
CREATE INDEX tasks_lease_expiry ON tasks (lease_expires_at) WHERE lease_expires_at IS NOT NULL;
-- Concurrency caps count the running tasks of a quota key; tasks without
-- one stay out of the index, so most claims do not write to it.
CREATE INDEX tasks_running_quota ON tasks (queue, quota_key) WHERE state = 'running' AND quota_key <> '';
-- The ordinary claim order of a queue (without ageing): a claim reads the
-- first unlocked entry.
CREATE INDEX tasks_pending_order ON tasks (queue, priority DESC, continuation DESC, due_at, id)
    WHERE state = 'pending';
-- The same order inside one fairness key: the fair claim reads the head of
-- the key it chose from here.
CREATE INDEX tasks_pending_key ON tasks (queue, fairness_key, priority DESC, continuation DESC, due_at, id)
    WHERE state = 'pending';
-- Rows pinned to a worker are rare; the claim probes them separately.
CREATE INDEX tasks_pending_sticky ON tasks (queue, sticky_worker)
    WHERE state = 'pending' AND sticky_worker IS NOT NULL;
-- Promotion of scheduled rows once they are due.
CREATE INDEX tasks_scheduled_due ON tasks (queue, due_at) WHERE state = 'scheduled';
-- Claims of the last minute per key, for the per-key view: the tasks of a
-- queue claimed since a time, read from this index alone (claimed_at is the
-- latest claim of the task, so a retry within the window counts once).
CREATE INDEX tasks_claimed_at ON tasks (queue, claimed_at, fairness_key) WHERE claimed_at IS NOT NULL;

-- fair_state: one row per (queue, fairness key) that has had due pending
-- work or has been charged. Only a transaction holding the queue's fair
-- lock (harvest_queue_lock) writes it, so its rows are exact for every
-- fair claim and nobody ever waits for one of its row locks. It carries:
--   * the start-time fair queuing state (pass, last_start, charged_at), NULL
--     until the key's first fair charge: such a row counts as "no state";
--   * the key's head: the first due pending row in the claim order within
--     the key, or one that came before it. Starts never write here (they
--     append to fair_arrivals), and rows that stop being pending are not
--     looked at, so a head may be optimistic: a fair claim checks the head
--     of the key it picks against the key's index and repairs it.
-- in_debt is pass > V, V being the queue's largest last_start (kept in
-- fair_queues). A charge sets it on the charged key and clears it on every
-- key the new V reached.
CREATE TABLE fair_state (
    queue      text             NOT NULL,
    key        text             NOT NULL,
    pass       double precision,
    last_start double precision,
    charged_at timestamptz,
    in_debt    boolean          NOT NULL DEFAULT false,
    head_id    bigint,
    head_prio  integer,
    head_cont  boolean,
    head_due   timestamptz,
    PRIMARY KEY (queue, key),
    CHECK ((pass IS NULL) = (charged_at IS NULL) AND (pass IS NULL) = (last_start IS NULL)),
    CHECK ((head_id IS NULL) = (head_prio IS NULL) AND (head_id IS NULL) = (head_cont IS NULL)
           AND (head_id IS NULL) = (head_due IS NULL))
) WITH (fillfactor = 50, autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 500);

-- The best key without debt (lag 0): by its head.
CREATE INDEX fair_state_free ON fair_state (queue, head_prio DESC, head_cont DESC, head_due, head_id)
    WHERE head_id IS NOT NULL AND NOT in_debt;
-- The best key in debt: by head priority, then pass (the lag).
CREATE INDEX fair_state_debt ON fair_state (queue, head_prio DESC, pass, head_cont DESC, head_due, head_id)
    WHERE head_id IS NOT NULL AND in_debt;
-- Keys whose debt a clock advance clears.
CREATE INDEX fair_state_debt_pass ON fair_state (queue, pass) WHERE in_debt;

-- fair_queues: the clock V of each queue with fairness state, the largest
-- last_start of its keys. Kept in a row of its own so that a claim reads
-- it with one probe and moves it without touching an index (a HOT update);
-- like fair_state it is written only under the queue's fair lock.
CREATE TABLE fair_queues (
    queue text             PRIMARY KEY,
    clock double precision NOT NULL
) WITH (fillfactor = 20, autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 200);

-- fair_arrivals: new due work, appended by whatever makes a task row
-- pending (a start, a promotion, a retry, a rescued lease) and folded into
-- fair_state by the next fair claim of the queue, under the queue's lock.
-- Nothing but the folding claim deletes a row and nobody updates one, so a
-- start never waits for a claim nor a claim for a start; a row of an
-- uncommitted start is simply not folded yet.
CREATE TABLE fair_arrivals (
    queue     text        NOT NULL,
    key       text        NOT NULL,
    head_id   bigint      NOT NULL,
    head_prio integer     NOT NULL,
    head_cont boolean     NOT NULL,
    head_due  timestamptz NOT NULL
) WITH (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 1000);

CREATE INDEX fair_arrivals_queue ON fair_arrivals (queue);

-- weight_overrides: per-key weights; a key without a row weighs 1.
CREATE TABLE weight_overrides (
    queue      text             NOT NULL,
    key        text             NOT NULL CHECK (key <> ''),
    weight     double precision NOT NULL CHECK (weight >= 0.001 AND weight <= 1000),
    updated_at timestamptz      NOT NULL DEFAULT now(),
    updated_by text             NOT NULL DEFAULT '',
    PRIMARY KEY (queue, key)
);

-- weight_override_counts: how many overrides each queue holds. A trigger
-- keeps it exact whatever statement writes weight_overrides, and the check
-- makes the cap of 1,000 overrides per queue (fairkeys.MaxOverridesPerQueue)
-- a database invariant that no race of writers can pass. Setters lock the
-- queue's row before they look at the count, so writers of one queue take
-- turns and a refusal is decided on the committed count.
CREATE TABLE weight_override_counts (
    queue text    PRIMARY KEY,
    n     integer NOT NULL DEFAULT 0,
    CONSTRAINT weight_override_cap CHECK (n >= 0 AND n <= 1000)
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

-- Deferred starts: throttled, debounced and batched starts that fire a run
-- later (see docs/deferred.md). A deferred start that is still waiting is
-- a *group* (the run it will fire) plus, for debounce and batch, one
-- *member* row per start:
--   * throttle: one group per start; the run it fires has the start's id.
--   * debounce: one group per window; every start of the window is a member.
--   * batch:    one group per batch; every start gathered is a member.
-- While a group waits, the run it will fire already exists in runs with
-- status 'deferred' (no task): that row reserves the id, answers GET, shows
-- in listings, can be cancelled like any run, and holds the tenant's
-- admission slot. Firing replaces that row with the real run, in the same
-- transaction that marks the group fired.
CREATE TABLE deferred_groups (
    pk             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant         text        NOT NULL,
    -- The id of the run this group fires (its 'deferred' row until then).
    run_id         text        NOT NULL,
    mode           text        NOT NULL CHECK (mode IN ('throttle', 'debounce', 'batch')),
    queue          text        NOT NULL,
    -- The throttle, debounce or batch key; '' when the start named none.
    key            text        NOT NULL,
    -- pending: waiting; fired: its run was started; cancelled: its run was
    -- cancelled while it waited, so it never fires.
    state          text        NOT NULL DEFAULT 'pending'
                   CHECK (state IN ('pending', 'fired', 'cancelled')),
    -- When the group is due: throttle, the slot its key's limit allows;
    -- debounce, the end of the quiet period (capped by deadline); batch,
    -- max_wait after the first member.
    fires_at       timestamptz NOT NULL,
    -- Debounce: the first start plus max_wait (NULL: no cap).
    deadline       timestamptz,
    -- Throttle: the limit and period of the start.
    throttle_limit integer     CHECK (throttle_limit > 0),
    period_us      bigint      CHECK (period_us > 0),
    -- Batch: how many members fire the batch at once, and how many it has.
    max_size       integer     CHECK (max_size > 0),
    size           integer     NOT NULL DEFAULT 1,
    -- The start request the run is started with (JSON, without the id),
    -- kept byte for byte so that the fired run's request hash is the one a
    -- replay of the start computes.
    request        bytea       NOT NULL,
    -- Batch: the members' inputs in arrival order.
    input          jsonb,
    trace_context  jsonb,
    opened_at      timestamptz NOT NULL,
    fired_at       timestamptz,
    UNIQUE (tenant, run_id)
);

-- At most one open debounce window and one open batch per key: concurrent
-- starts of a key join the same group.
CREATE UNIQUE INDEX deferred_groups_open ON deferred_groups (tenant, queue, mode, key)
    WHERE state = 'pending' AND mode IN ('debounce', 'batch');
-- What is due: the firers' scan.
CREATE INDEX deferred_groups_due ON deferred_groups (fires_at) WHERE state = 'pending';
-- A throttle key's queue, in arrival order.
CREATE INDEX deferred_groups_throttle_pending ON deferred_groups (tenant, queue, key, pk)
    WHERE mode = 'throttle' AND state = 'pending';
-- A throttle key's recent runs: the window its limit counts.
CREATE INDEX deferred_groups_throttle_fired ON deferred_groups (tenant, queue, key, fired_at)
    WHERE mode = 'throttle' AND state = 'fired';
-- Pruning of groups that are done.
CREATE INDEX deferred_groups_done ON deferred_groups (coalesce(fired_at, opened_at))
    WHERE state <> 'pending';

-- deferred_starts: the starts of debounce windows and batches, by their own
-- id, so each resolves to its group's run and replays idempotently.
CREATE TABLE deferred_starts (
    tenant       text        NOT NULL,
    id           text        NOT NULL,
    group_pk     bigint      NOT NULL REFERENCES deferred_groups (pk) ON DELETE CASCADE,
    -- Arrival order within the group, from 1.
    position     integer     NOT NULL,
    request_hash bytea       NOT NULL,
    accepted_at  timestamptz NOT NULL,
    PRIMARY KEY (tenant, id)
);

CREATE INDEX deferred_starts_group ON deferred_starts (group_pk, position);

-- What a claim hands back: outcome 'ok', 'no_task' or 'refused', the lag of
-- the chosen key (fair claims), the refusals met on the way, and the task.
CREATE TYPE harvest_claimed AS (
    outcome          text,
    lag              double precision,
    refusals         jsonb,
    id               bigint,
    run_pk           bigint,
    queue            text,
    fairness_key     text,
    quota_key        text,
    priority         integer,
    continuation     boolean,
    due_at           timestamptz,
    sticky_worker    text,
    sticky_until     timestamptz,
    step             integer,
    input            jsonb,
    attempt          integer,
    lease_token      uuid,
    lease_expires_at timestamptz,
    trace_context    jsonb
);
