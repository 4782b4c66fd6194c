-- The settings of a quota as JSON, for audit rows and change reports.
CREATE OR REPLACE FUNCTION harvest_quota_json(p_max integer, p_rate double precision, p_burst double precision) RETURNS jsonb
LANGUAGE sql IMMUTABLE AS $$
    SELECT jsonb_build_object('max_concurrent', p_max, 'rate', p_rate, 'burst', p_burst)
$$;
