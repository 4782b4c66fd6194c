-- True when row 1 comes before row 2 in the claim order within one key
-- (priority descending, continuation first, due time, id). A missing row 2
-- (id NULL) loses to anything.
CREATE OR REPLACE FUNCTION harvest_beats(p1 integer, c1 boolean, d1 timestamptz, i1 bigint,
                                         p2 integer, c2 boolean, d2 timestamptz, i2 bigint) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT i2 IS NULL OR (-p1, NOT c1, d1, i1) < (-p2, NOT c2, d2, i2)
$$;
