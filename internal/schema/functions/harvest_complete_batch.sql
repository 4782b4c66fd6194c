-- Finish several leased tasks and their runs, each fenced by its lease
-- token: a task whose token is not current (or that is not running) is left
-- alone and reported 'stale', an unknown id 'not_found'; the others are
-- 'ok'. Answers come in the order of p_ids. Rows are locked in id order and
-- tenants' counts are updated in tenant order, so concurrent batches cannot
-- deadlock on each other.
CREATE OR REPLACE FUNCTION harvest_complete_batch(p_ids bigint[], p_tokens uuid[], p_outputs jsonb[])
RETURNS TABLE (task_id bigint, outcome text)
LANGUAGE plpgsql
-- No JIT: see harvest_claim_batch.
SET jit = off
AS $$
DECLARE
    v_done    bigint[];
    v_done_tok uuid[];
    v_tenants text[];
    r_cnt     record;
BEGIN
    IF cardinality(p_ids) IS DISTINCT FROM cardinality(p_tokens)
       OR cardinality(p_ids) IS DISTINCT FROM cardinality(p_outputs) THEN
        RAISE EXCEPTION 'harvest_complete_batch: % ids, % tokens, % outputs',
            cardinality(p_ids), cardinality(p_tokens), cardinality(p_outputs);
    END IF;
    PERFORM 1 FROM tasks t WHERE t.id = ANY (p_ids) ORDER BY t.id FOR UPDATE;
    WITH inp AS (
        SELECT i.id, i.token, i.output FROM unnest(p_ids, p_tokens, p_outputs) AS i(id, token, output)
    ), ok AS (
        UPDATE tasks t SET state = 'done', lease_expires_at = NULL
        FROM inp
        WHERE t.id = inp.id AND t.state = 'running' AND t.lease_token = inp.token
        RETURNING t.id, t.lease_token, t.run_pk, inp.output
    ), fin AS (
        UPDATE runs r SET status = 'completed', output = ok.output, error = NULL, finished_at = now()
        FROM ok
        WHERE r.pk = ok.run_pk AND r.status NOT IN ('completed', 'failed', 'cancelled')
        RETURNING r.tenant
    )
    SELECT (SELECT array_agg(ok.id) FROM ok), (SELECT array_agg(ok.lease_token) FROM ok),
           (SELECT array_agg(fin.tenant) FROM fin)
    INTO v_done, v_done_tok, v_tenants;
    FOR r_cnt IN SELECT t.tenant, count(*)::integer AS n FROM unnest(v_tenants) AS t(tenant)
                 GROUP BY t.tenant ORDER BY t.tenant COLLATE "C" LOOP
        UPDATE tenant_running SET running = greatest(running - r_cnt.n, 0)
        WHERE tenant = r_cnt.tenant AND running > 0;
    END LOOP;
    RETURN QUERY
        SELECT i.id,
               CASE WHEN EXISTS (SELECT 1 FROM unnest(v_done, v_done_tok) AS d(id, tok)
                                 WHERE d.id = i.id AND d.tok = p_tokens[i.ord]) THEN 'ok'
                    WHEN EXISTS (SELECT 1 FROM tasks t WHERE t.id = i.id) THEN 'stale'
                    ELSE 'not_found' END
        FROM unnest(p_ids) WITH ORDINALITY AS i(id, ord)
        ORDER BY i.ord;
END
$$;
