-- queue_pauses: the queues an operator paused, on every shard. A claim of a
-- paused queue takes nothing (harvest_claim, harvest_claim_batch); starts
-- are still written, so the backlog waits and the workers find it on
-- resume. The pause writer takes the queue's pause lock exclusively
-- (harvest_queue_pause_lock) while every claim takes it shared, so once a
-- pause has committed no claim that began before it is still taking tasks.
CREATE TABLE queue_pauses (
    queue     text        PRIMARY KEY,
    paused_at timestamptz NOT NULL DEFAULT now(),
    paused_by text        NOT NULL DEFAULT ''
);
