-- Tenant placement and online moves (docs/operations.md, "Moving a tenant").
--
-- tenant_homes, used on shard 0 only: the recorded home shard of every
-- tenant the fleet has seen. A gateway places a tenant it meets for the
-- first time by rendezvous hashing over the shards it has and records it
-- here; from then on the record, not the hash, decides, so adding a shard
-- moves nobody. A move in progress is kept in the same row, so that
-- `harvest tenants move` run again after a crash knows where it stopped:
--   * phase 'fencing': the move to move_to was asked for; shard is still
--     the home and takes the tenant's starts until its fence is up;
--   * phase 'copying': shard is the new home and takes the starts;
--     moving_from is the old home, whose runs are still being copied;
--   * phase 'home': nothing in progress.
-- version grows with every change, so a cache can tell an old row from a
-- new one whatever order the change events arrive in.
CREATE TABLE tenant_homes (
    tenant      text        PRIMARY KEY,
    shard       integer     NOT NULL CHECK (shard >= 0),
    phase       text        NOT NULL DEFAULT 'home' CHECK (phase IN ('home', 'fencing', 'copying')),
    move_to     integer     CHECK (move_to >= 0),
    moving_from integer     CHECK (moving_from >= 0),
    -- How the tenant got its home: 'hash' (placed on first sight), 'pin'
    -- or 'move' (by an operator).
    placed_by   text        NOT NULL DEFAULT 'hash' CHECK (placed_by IN ('hash', 'pin', 'move')),
    version     bigint      NOT NULL DEFAULT 1,
    updated_at  timestamptz NOT NULL DEFAULT now(),
    CHECK ((phase = 'fencing') = (move_to IS NOT NULL)),
    CHECK ((phase = 'copying') = (moving_from IS NOT NULL))
);

-- tenant_fences, on every shard: tenants whose home this shard no longer
-- is. A start of a fenced tenant fails with HA020 (harvest_tenant_fence)
-- in the statement that writes it, which runs after the start's lock on
-- the tenant's count row; the fence is raised under the same lock, so no
-- start can land on the old home once the fence has committed.
CREATE TABLE tenant_fences (
    tenant   text        PRIMARY KEY,
    moved_to integer     NOT NULL CHECK (moved_to >= 0),
    since    timestamptz NOT NULL DEFAULT now()
);

-- tenant_away, on a tenant's new home while it moves: how many of its
-- unfinished runs are still counted on the old home. Admission judges the
-- tenant's own limit by tenant_running plus this figure, so a move never
-- lets a tenant past its limit; the shard's own total leaves it out, as
-- those runs hold capacity on the old home.
CREATE TABLE tenant_away (
    tenant text    PRIMARY KEY,
    runs   integer NOT NULL CHECK (runs >= 0)
);

-- move_out, on a tenant's old home: the runs a move has taken off this
-- shard's claimers and is copying to moved_to. Their live task, if any,
-- is in state 'moving', which no claim, promotion or rescue looks at; a
-- cancel of such a run is refused until the copy is done. The row goes
-- with the run, once the new home holds it.
CREATE TABLE move_out (
    run_pk   bigint  PRIMARY KEY REFERENCES runs (pk) ON DELETE CASCADE,
    tenant   text    NOT NULL,
    moved_to integer NOT NULL CHECK (moved_to >= 0)
);
CREATE INDEX move_out_tenant ON move_out (tenant);

ALTER TABLE tasks DROP CONSTRAINT tasks_state_check;
ALTER TABLE tasks ADD CONSTRAINT tasks_state_check
    CHECK (state IN ('scheduled', 'pending', 'running', 'done', 'moving'));
