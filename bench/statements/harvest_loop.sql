-- Claim a batch and complete it, as a worker's claim loop and outcome
-- flusher send them (the fair claim, its own transaction, then the wait for
-- its flush, pkg/claim/sql/WalFlush.sql; the outcomes in another), until
-- this loop's share of half the flood is done; prints the time a task
-- took, and the claim's part of it. run.sh sets synchronous_commit (off by
-- default: then, with one backend and nothing else running, the time is
-- the backend's CPU).
DO $$
DECLARE
    v_batch int := current_setting('harvest_bench.batch')::int;
    v_stop  int := current_setting('harvest_bench.rows')::int / 2;
    v_ids   bigint[];
    v_toks  uuid[];
    v_n     int;
    v_done  int := 0;
    v_claim interval := '0';
    v_t     timestamptz;
    v_t0    timestamptz := clock_timestamp();
BEGIN
    WHILE v_done < v_stop LOOP
        v_t := clock_timestamp();
        SELECT array_agg(c.id ORDER BY c.id), array_agg(c.lease_token ORDER BY c.id) INTO v_ids, v_toks
        FROM harvest_claim_batch('fleet', 'w', NULL, true, 0, interval '30s', v_batch, true, 0) c
        WHERE c.outcome = 'ok';
        COMMIT;
        PERFORM CASE WHEN current_setting('harvest.flush', true) = 'on'
                     THEN pg_logical_emit_message(true, 'harvest.flush', '') END,
                set_config('harvest.flush', '', false);
        COMMIT;
        v_claim := v_claim + (clock_timestamp() - v_t);
        v_n := coalesce(cardinality(v_ids), 0);
        EXIT WHEN v_n = 0;
        PERFORM * FROM harvest_outcome_batch(array_fill('complete'::text, ARRAY[v_n]), v_ids, v_toks,
            array_fill(NULL::jsonb, ARRAY[v_n]), array_fill(NULL::text, ARRAY[v_n]),
            array_fill(NULL::timestamptz, ARRAY[v_n]), array_fill(NULL::timestamptz, ARRAY[v_n]),
            array_fill(NULL::timestamptz, ARRAY[v_n]), NULL);
        COMMIT;
        v_done := v_done + v_n;
    END LOOP;
    RAISE NOTICE 'harvest: % tasks, % us a task, of which the claim %', v_done,
        round((extract(epoch FROM clock_timestamp() - v_t0) * 1e6 / v_done)::numeric, 1),
        round((extract(epoch FROM v_claim) * 1e6 / v_done)::numeric, 1);
END $$;
