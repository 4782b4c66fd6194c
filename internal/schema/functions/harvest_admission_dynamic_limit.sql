-- Dynamic's per-tenant limit with p_spare runs of max_runs free: the
-- smallest whole number not below TFM x spare, computed with the float
-- operations of tenantcap.Limit in the same order (x - slack(x), then
-- ceil), so that both give the same number, and clamped as clampLimit
-- clamps it. Part of harvest_admission_decide, inlined like it.
CREATE OR REPLACE FUNCTION harvest_admission_dynamic_limit(p_tfm double precision, p_spare bigint)
RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE
        WHEN ceil(p_tfm * p_spare::double precision
                  - 1e-9::double precision * greatest(1::double precision, abs(p_tfm * p_spare::double precision))) <= 0
             THEN 0
        WHEN ceil(p_tfm * p_spare::double precision
                  - 1e-9::double precision * greatest(1::double precision, abs(p_tfm * p_spare::double precision)))
             >= 2147483647
             THEN 2147483647
        ELSE ceil(p_tfm * p_spare::double precision
                  - 1e-9::double precision * greatest(1::double precision, abs(p_tfm * p_spare::double precision)))::bigint
    END
$$;
