-- worker_presence: which workers serve which queues of this shard, so that
-- GET /v1/runs/{id} can say a queued run waits because nobody claims from
-- its queue. A worker upserts one row per queue it claims from when it
-- starts and then every presence interval (pkg/worker), with the database
-- clock, and deletes its rows when it stops cleanly. A worker that died
-- leaves its rows behind: they stop counting once live_until has passed
-- (three intervals after seen_at), and any worker's next announcement
-- deletes them an hour later.
-- Nothing on the claim path reads or writes this table.
CREATE TABLE worker_presence (
    worker     text        NOT NULL,
    queue      text        NOT NULL,
    -- fair: the worker claims the queue in fair order of fairness keys.
    fair       boolean     NOT NULL DEFAULT false,
    seen_at    timestamptz NOT NULL DEFAULT now(),
    live_until timestamptz NOT NULL,
    PRIMARY KEY (worker, queue)
);

-- The readers ask about one queue.
CREATE INDEX worker_presence_queue ON worker_presence (queue, live_until);
