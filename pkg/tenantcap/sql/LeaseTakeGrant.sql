-- Take in what the ledger has granted this shard, $1 in all (the ledger
-- row's granted), and return the lease. Raising to the figure, not adding
-- to it, makes a late or repeated call harmless. A larger lease needs no
-- admission lock: a start judged by the smaller one is still within it.
UPDATE admission_lease SET granted = greatest(granted, $1)
RETURNING granted, returned, harvest_shard_running() AS running
