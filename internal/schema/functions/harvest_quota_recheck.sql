-- The rechecks of a claim of a row whose quota key is p_quota_key (not
-- empty) in p_queue: NULL when the claim may go on, else why it is refused
-- ('concurrency_cap', 'rate_limit'). A quota key without a quota row is not
-- limited. The quota row is locked (FOR NO KEY UPDATE) before the running
-- rows are counted, so the claims of one quota key take turns until commit
-- and a cap is never exceeded by claimers racing on the count; then the
-- token bucket is refilled to p_now and, when a token is left, one is
-- taken. The single claim's step 3 (harvest_claim_step). The fair bulk
-- step (harvest_claim_bulk_fair, 3a) makes the same rechecks for all its
-- rows at once, with the same locks and the same numbers, and so does the
-- ordinary bulk step (harvest_claim_bulk, through
-- harvest_bulk_quotas).
-- The quota row is waited for only in the lock order of the quota rows
-- (harvest_bulk_quotas): with p_ordered (an ordinary claim) a key that
-- sorts before a quota row the transaction holds is taken only when free,
-- else the answer is 'busy' and the caller ends its claim without the row.
DROP FUNCTION IF EXISTS harvest_quota_recheck(text, text, timestamptz);
CREATE OR REPLACE FUNCTION harvest_quota_recheck(p_queue text, p_quota_key text, p_now timestamptz,
                                                 p_ordered boolean DEFAULT false) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    v_running integer;
    v_tokens  double precision;
    v_top     text[] := nullif(current_setting('harvest.quota_top', true), '')::text[];
    r_quota   quotas%ROWTYPE;
    r_bucket  rate_buckets%ROWTYPE;
BEGIN
    IF p_ordered AND ARRAY[p_queue, p_quota_key] < v_top THEN
        SELECT * INTO r_quota FROM quotas
        WHERE queue = p_queue AND quota_key = p_quota_key
        FOR NO KEY UPDATE SKIP LOCKED;
        IF NOT FOUND THEN
            IF EXISTS (SELECT 1 FROM quotas WHERE queue = p_queue AND quota_key = p_quota_key) THEN
                RETURN 'busy';
            END IF;
            RETURN NULL;
        END IF;
    ELSE
        SELECT * INTO r_quota FROM quotas
        WHERE queue = p_queue AND quota_key = p_quota_key
        FOR NO KEY UPDATE;
        IF NOT FOUND THEN
            RETURN NULL;
        END IF;
        PERFORM set_config('harvest.quota_top', greatest(v_top, ARRAY[p_queue, p_quota_key])::text, true);
    END IF;
    IF r_quota.max_concurrent IS NOT NULL THEN
        SELECT count(*) INTO v_running FROM tasks x
        WHERE x.queue = p_queue AND x.quota_key = p_quota_key AND x.quota_key <> ''
          AND x.state = 'running';
        IF v_running >= r_quota.max_concurrent THEN
            RETURN 'concurrency_cap';
        END IF;
    END IF;
    IF r_quota.rate IS NOT NULL THEN
        SELECT * INTO r_bucket FROM rate_buckets
        WHERE queue = p_queue AND quota_key = p_quota_key
        FOR NO KEY UPDATE;
        IF FOUND THEN
            v_tokens := least(r_quota.burst,
                r_bucket.tokens + r_quota.rate * harvest_secs(greatest(harvest_us(p_now, r_bucket.updated_at), 0)));
        ELSE
            v_tokens := r_quota.burst;
        END IF;
        IF v_tokens < 1 THEN
            RETURN 'rate_limit';
        END IF;
        INSERT INTO rate_buckets (queue, quota_key, tokens, updated_at)
        VALUES (p_queue, p_quota_key, v_tokens - 1, p_now)
        ON CONFLICT (queue, quota_key) DO UPDATE
        SET tokens = EXCLUDED.tokens, updated_at = EXCLUDED.updated_at;
    END IF;
    RETURN NULL;
END
$$;
