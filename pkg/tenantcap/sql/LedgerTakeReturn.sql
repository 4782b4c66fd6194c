-- Take in what shard $1 has given back, $2 in all (its lease row's
-- returned). Raising to the figure, not adding to it, makes a late or
-- repeated call harmless.
UPDATE admission_ledger SET returned = greatest(returned, $2) WHERE shard = $1
