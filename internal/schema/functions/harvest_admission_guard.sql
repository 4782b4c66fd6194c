-- A start group written with an admission guard (see RunStartMany) stops
-- here when its counts went past what the gateway could promise to admit:
-- the group is then written again and every start judged on its own.
-- Error code HA010 (class HA is Harvest's own; HA001 and HA002 are the
-- lease errors of harvest_leased).
CREATE OR REPLACE FUNCTION harvest_admission_guard(p_ok boolean) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    IF NOT p_ok THEN
        RAISE EXCEPTION 'start group beyond its admission guard' USING ERRCODE = 'HA010';
    END IF;
    RETURN true;
END
$$;
