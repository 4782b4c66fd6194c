-- Seconds of a microsecond count, rounded the way Go's Duration.Seconds
-- rounds, so the rate buckets agree with the reference model bit for bit.
CREATE OR REPLACE FUNCTION harvest_secs(us bigint) RETURNS double precision
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT (us / 1000000)::double precision + ((us % 1000000) * 1000)::double precision / 1e9::double precision
$$;
