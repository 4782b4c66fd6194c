-- Copy one override unless the key has one here (the all-shard fan-out
-- may have written it already, and it wins). The count trigger's cap check
-- may refuse it.
INSERT INTO weight_overrides (queue, key, weight, updated_at, updated_by)
VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (queue, key) DO NOTHING
