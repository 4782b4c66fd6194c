-- Make any missing row of shard_running (the trigger on tenant_running
-- only updates rows), before the recount locks them all
-- (RecountStripesLock); returns how many were made.
WITH made AS (
    INSERT INTO shard_running (stripe) SELECT s FROM generate_series(0, 16) AS s
    ON CONFLICT (stripe) DO NOTHING
    RETURNING stripe
)
SELECT count(*) FROM made
