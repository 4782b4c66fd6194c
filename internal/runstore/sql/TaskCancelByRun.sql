-- Take every unfinished task of a run out of play: a pending one leaves the
-- claimable set (a key head that pointed at it is stale, never late, and
-- the next fair claim of the queue moves it on), a scheduled one will never be
-- promoted, and a running one loses its lease token, so the worker's next
-- heartbeat, completion or failure is refused as a stale lease and its
-- result is discarded. Returns the state each task was in and its claim
-- time: the attempts of the running ones end here, and the cancel counts
-- them in the run (RunFinish), as the claim no longer does.
WITH t AS (
    SELECT id, state FROM tasks
    WHERE run_pk = $1 AND state <> 'done'
    FOR UPDATE
)
UPDATE tasks x
SET state = 'done', lease_token = NULL, lease_expires_at = NULL
FROM t
WHERE x.id = t.id
RETURNING t.state, x.claimed_at
