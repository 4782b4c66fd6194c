-- Give key $2 of queue $1 a debt of $3 (its lag) ahead of this shard's
-- clock $4: pass = clock + lag, unless the key owes more here already.
-- last_start stays at or below the clock (a new row starts at the clock),
-- so V, the largest last_start, does not move; in_debt is pass > V, true.
-- The head is left alone: arrivals fold it in. The caller holds the fair
-- lock.
INSERT INTO fair_state AS f (queue, key, pass, last_start, charged_at, in_debt)
VALUES ($1, $2, $4::double precision + $3::double precision, $4::double precision, now(), true)
ON CONFLICT (queue, key) DO UPDATE SET
    pass       = greatest(coalesce(f.pass, excluded.pass), excluded.pass),
    last_start = coalesce(f.last_start, excluded.last_start),
    charged_at = excluded.charged_at,
    in_debt    = true
