-- Every shard's account in the ledger, without locks.
SELECT shard, granted, returned FROM admission_ledger ORDER BY shard
