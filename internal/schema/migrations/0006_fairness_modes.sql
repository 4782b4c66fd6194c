-- Per-queue fairness modes: two-level fairness (tenants first, then each
-- tenant's keys) and charging by worker time instead of per claim.

-- queue_fairness: the modes of a queue on this shard. A queue without a row
-- is one-level and charged per claim, as before this migration. Written by
-- harvest_queue_fairness_set only, under the queue's fair lock, so a claim
-- reads one mode for the whole of its turn.
CREATE TABLE queue_fairness (
    queue      text        PRIMARY KEY,
    two_level  boolean     NOT NULL DEFAULT false,
    charge     text        NOT NULL DEFAULT 'claims' CHECK (charge IN ('claims', 'runtime')),
    updated_at timestamptz NOT NULL DEFAULT now(),
    updated_by text        NOT NULL DEFAULT ''
);

-- group_weights: the weight of a group (the tenant part of its keys) in a
-- two-level queue; a group without a row weighs 1. Same range as a key's.
CREATE TABLE group_weights (
    queue      text             NOT NULL,
    grp        text             NOT NULL,
    weight     double precision NOT NULL CHECK (weight >= 0.001 AND weight <= 1000),
    updated_at timestamptz      NOT NULL DEFAULT now(),
    updated_by text             NOT NULL DEFAULT '',
    PRIMARY KEY (queue, grp)
);

-- fair_groups: the start-time fair queuing state of each group of a
-- two-level queue (pass, last_start, charged_at, as fair_state's for keys)
-- and key_clock, the clock of the group's own keys: the largest last_start
-- among them. The groups' clock is fair_queues.group_clock. Written only
-- under the queue's fair lock, like fair_state.
CREATE TABLE fair_groups (
    queue      text             NOT NULL,
    grp        text             NOT NULL,
    pass       double precision,
    last_start double precision,
    charged_at timestamptz,
    key_clock  double precision NOT NULL DEFAULT 0,
    PRIMARY KEY (queue, grp),
    CHECK ((pass IS NULL) = (charged_at IS NULL) AND (pass IS NULL) = (last_start IS NULL))
) WITH (fillfactor = 50, autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 500);

ALTER TABLE fair_queues ADD COLUMN group_clock double precision NOT NULL DEFAULT 0;

-- held_est: in a queue charged by runtime, the seconds a claim of the key
-- is billed up front, a running mean of its tasks' held time (NULL: none
-- measured yet). The difference to the real time is settled at the end.
ALTER TABLE fair_state ADD COLUMN held_est double precision;

-- charged_secs: the seconds the current attempt was billed at its claim in
-- a queue charged by runtime; NULL in a queue charged per claim. The claim
-- writes it in the update that leases the row.
ALTER TABLE tasks ADD COLUMN charged_secs double precision;

-- fair_held: the worker time of attempts that ended, appended in the
-- transaction that took the task out of running (harvest_task_held) and
-- folded into the key's pass by the next fair claim of the queue, as
-- fair_arrivals are. Nobody updates a row, so an ending task never waits
-- for a claim, and each attempt is settled exactly once: the row commits
-- with the end of the attempt or not at all. id orders the rows, so a
-- fold adds up a key's time in the order the attempts ended.
CREATE TABLE fair_held (
    id      bigint           GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    task_id bigint           NOT NULL,
    queue   text             NOT NULL,
    key     text             NOT NULL,
    secs    double precision NOT NULL,
    billed  double precision NOT NULL
) WITH (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 1000);

CREATE INDEX fair_held_queue ON fair_held (queue);
