-- Shard 0's clock.
SELECT now()
