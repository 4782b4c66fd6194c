-- Lock the rows of shard_running a recount of tenants $1 moves (NULL:
-- all of them), by stripe, after the tenants' rows: stripe 0, where a
-- count that rises adds, and the stripes the tenants' falls go to
-- (harvest_running_stripe). It is the lock order of every holder of
-- several tenants' counts (harvest_running_lock); fixing the counts
-- without it would take the stripes in the order the rows change.
SELECT stripe FROM shard_running
WHERE $1::text[] IS NULL OR stripe = 0
   OR stripe IN (SELECT harvest_running_stripe(t) FROM unnest($1::text[]) AS t)
ORDER BY stripe
FOR NO KEY UPDATE
