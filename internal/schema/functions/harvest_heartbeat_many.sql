-- A worker's heartbeat of every task it runs, in one statement: extend each
-- lease by p_extend from now (database clock), fenced by its own token.
-- Answers come in the order of p_ids: 'ok' (extended), 'cancelled'
-- (extended, but the run was cancelled: its handler should stop), 'stale'
-- (the token is not current: the lease is lost, nothing was changed) or
-- 'not_found'.
--
-- Only lease_expires_at changes, and no index names it (migration 0011),
-- so each extension is a HOT update where the page has room (migration
-- 0011 keeps 30% of each page free): no index entry is written. Tasks are
-- locked in id order, as a completion batch locks them, so a worker's
-- heartbeat and its own outcome batch wait for each other at most.
CREATE OR REPLACE FUNCTION harvest_heartbeat_many(p_ids bigint[], p_tokens uuid[], p_extend interval)
RETURNS TABLE (task_id bigint, outcome text)
LANGUAGE plpgsql
-- No JIT: see harvest_claim_batch.
SET jit = off
-- No sequential scans either: a worker beats on one connection for hours,
-- and the plans the cache settled on while the shard was small read the
-- whole of tasks (the lock) and of runs (the answer's join) for every beat
-- once the shard had grown, until an analyze made them anew
-- (TestHeartbeatAndRescuePlansOutliveTheShardsGrowth).
SET enable_seqscan = off
AS $$
DECLARE
    v_ids bigint[];
    v_pks bigint[];
BEGIN
    IF cardinality(p_ids) IS DISTINCT FROM cardinality(p_tokens) THEN
        RAISE EXCEPTION 'harvest_heartbeat_many: % ids, % tokens', cardinality(p_ids), cardinality(p_tokens);
    END IF;
    PERFORM 1 FROM tasks t WHERE t.id = ANY (p_ids) ORDER BY t.id FOR NO KEY UPDATE;
    WITH beat AS (
        UPDATE tasks t SET lease_expires_at = now() + p_extend
        FROM unnest(p_ids, p_tokens) AS i(id, token)
        -- (id = ANY: the tasks are looked up by id, never found by a
        -- read of every running task, whatever the statistics say.)
        WHERE t.id = ANY (p_ids) AND t.id = i.id AND t.state = 'running' AND t.lease_token = i.token
        RETURNING t.id, t.run_pk
    )
    SELECT array_agg(b.id), array_agg(b.run_pk) INTO v_ids, v_pks FROM beat b;
    -- The leases extended, as arrays: joined with the items as a CTE,
    -- whose size the planner cannot know, they were scanned again for
    -- every item (100 leases: 9,900 pairs rejected).
    RETURN QUERY
        SELECT i.id,
               CASE WHEN b.id IS NULL THEN
                        CASE WHEN EXISTS (SELECT 1 FROM tasks t WHERE t.id = i.id) THEN 'stale' ELSE 'not_found' END
                    WHEN r.status = 'cancelled' THEN 'cancelled'
                    ELSE 'ok' END
        FROM unnest(p_ids) WITH ORDINALITY AS i(id, ord)
        LEFT JOIN unnest(v_ids, v_pks) AS b(id, run_pk) ON b.id = i.id
        LEFT JOIN runs r ON r.pk = b.run_pk
        ORDER BY i.ord;
END
$$;
