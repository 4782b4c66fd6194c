-- Grant $2 more capacity to shard $1 (under the ledger's lock, LedgerLock); the
-- new total granted is what the shard takes in (LeaseTakeGrant).
UPDATE admission_ledger SET granted = granted + $2 WHERE shard = $1
RETURNING granted
