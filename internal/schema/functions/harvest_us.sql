-- Microseconds from b to a, exactly (epoch values are numeric).
CREATE OR REPLACE FUNCTION harvest_us(a timestamptz, b timestamptz) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT (extract(epoch FROM a - b) * 1000000)::bigint
$$;
