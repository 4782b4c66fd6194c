-- Make the ledger row of shard $1 (shard 0's ledger) when it is missing.
INSERT INTO admission_ledger (shard) VALUES ($1) ON CONFLICT (shard) DO NOTHING
