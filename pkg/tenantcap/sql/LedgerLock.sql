-- Lock every row of the ledger, in shard order, and read them: granting
-- capacity checks the sum of what the shards hold under these locks, so
-- two grants cannot both take the last of it.
SELECT shard, granted, returned FROM admission_ledger ORDER BY shard FOR UPDATE
