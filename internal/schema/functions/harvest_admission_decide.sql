-- The admission rule, as tenantcap.Rule.Judge applies it, for a start
-- statement that decides its new runs itself (harvest_start_group). The
-- rule's figures come from the gateway (tenantcap.Rule.Params: the
-- algorithm, its multiplier, max_runs, Static's limit, which depends on
-- nothing the statement reads, the other shards' cached total, whether
-- the shard's lease binds, the cap on runs not due yet); the counts are
-- the statement's, read under its locks: p_local the shard's unfinished
-- runs, p_own the tenant's, p_lease the shard's capacity lease,
-- p_scheduled the tenant's runs not due yet including this one when it
-- is not due (0 when it is). All counts leave the run being decided out
-- except p_scheduled.
--
-- Returns NULL to admit, or why not: 'scheduled_limit', 'system_limit',
-- 'tenant_limit', or 'lease' when only the shard's lease refuses (the
-- cached totals would admit): the gateway then takes more capacity and
-- sends the start again. With the lease, the other shards are bounded by
-- what it leaves of max_runs; a refusal the cached totals share is theirs.
-- A property test drives this and Judge with random figures
-- (TestAdmissionDecideMatchesJudge).
--
-- An expression of SQL functions without tables, so that the planner
-- inlines it into the statement that calls it: a start group decides
-- each of its runs with no function call.
CREATE OR REPLACE FUNCTION harvest_admission_decide(p_algorithm text, p_tfm double precision, p_max_runs bigint,
                                                    p_static_limit bigint, p_others bigint, p_leased boolean,
                                                    p_scheduled_cap bigint, p_local bigint, p_own bigint,
                                                    p_lease bigint, p_scheduled bigint)
RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE
        WHEN p_scheduled > 0 AND p_scheduled > p_scheduled_cap THEN 'scheduled_limit'
        WHEN NOT p_leased THEN
            harvest_admission_rule(p_algorithm, p_tfm, p_max_runs, p_static_limit, p_local + p_others, p_own)
        WHEN harvest_admission_rule(p_algorithm, p_tfm, p_max_runs, p_static_limit,
                                    p_local + greatest(p_others, p_max_runs - p_lease), p_own) IS NULL THEN NULL
        ELSE coalesce(harvest_admission_rule(p_algorithm, p_tfm, p_max_runs, p_static_limit, p_local + p_others,
                                             p_own), 'lease')
    END
$$;
