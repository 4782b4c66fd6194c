-- Element by element: p_at[i] when set, otherwise p_base plus p_us[i]
-- microseconds (NULL when both are NULL). The times of a batch of outcomes
-- come either way: absolute from a caller that fixes them, as delays from
-- a worker, which leaves the clock to the database.
CREATE OR REPLACE FUNCTION harvest_outcome_times(p_at timestamptz[], p_us bigint[], p_base timestamptz)
RETURNS timestamptz[]
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT coalesce(array_agg(coalesce(u.at, p_base + u.us * interval '1 microsecond') ORDER BY u.ord),
                    '{}'::timestamptz[])
    FROM unnest(p_at, p_us) WITH ORDINALITY AS u(at, us, ord)
$$;
