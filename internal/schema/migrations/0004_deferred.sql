-- Deferred starts: throttled, debounced and batched starts that fire a run
-- later (see docs/deferred.md). Additive: two new tables; the runs table
-- is used as it is, with the status 'deferred' it always allowed.
--
-- A deferred start that is still waiting is a *group* (the run it will
-- fire) plus, for debounce and batch, one *member* row per start:
--   * throttle: one group per start; the run it fires has the start's id.
--   * debounce: one group per window; every start of the window is a member.
--   * batch:    one group per batch; every start gathered is a member.
-- While a group waits, the run it will fire already exists in runs with
-- status 'deferred' (no task): that row reserves the id, answers GET, shows
-- in listings, can be cancelled like any run, and holds the tenant's
-- admission slot (it counts in tenant_running like any unfinished run).
-- Firing replaces that row with the real run, in the same transaction that
-- marks the group fired.

-- deferred_groups: one row per run to fire.
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
