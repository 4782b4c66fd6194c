-- tenantcap.Decide: why a tenant holding p_own runs may not start another
-- when the system holds p_total unfinished runs ('system_limit' at
-- max_runs, 'tenant_limit' at the algorithm's limit), or NULL to admit.
-- Static's limit comes from the gateway (it depends on no count); Dynamic's
-- is harvest_admission_dynamic_limit. Part of harvest_admission_decide,
-- inlined into its caller like it.
CREATE OR REPLACE FUNCTION harvest_admission_rule(p_algorithm text, p_tfm double precision, p_max_runs bigint,
                                                  p_static_limit bigint, p_total bigint, p_own bigint)
RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE
        WHEN p_total >= p_max_runs THEN 'system_limit'
        WHEN p_algorithm = 'static' AND p_own >= p_static_limit THEN 'tenant_limit'
        WHEN p_algorithm = 'dynamic'
             AND p_own >= harvest_admission_dynamic_limit(p_tfm, greatest(p_max_runs - p_total, 0)) THEN 'tenant_limit'
    END
$$;
