-- One ordinary bulk step of a batch: the first unlocked rows of the seek
-- index, up to p_n, as that many single ordinary claims would take them,
-- stopping before the first row with a quota key (its rechecks are the
-- single claim's). The caller checked that there is no ageing and no row
-- pinned to the worker. Fair steps are harvest_claim_bulk_fair's.
CREATE OR REPLACE FUNCTION harvest_claim_bulk(p_queue text, p_worker text, p_now timestamptz,
                                              p_lease interval, p_n integer)
RETURNS SETOF harvest_claimed
LANGUAGE plpgsql AS $$
DECLARE
    v_due_cut timestamptz := CASE WHEN p_now IS NULL THEN 'infinity'::timestamptz ELSE p_now END;
BEGIN
    RETURN QUERY SELECT * FROM harvest_lease_rows(ARRAY(
        WITH picked AS (
            SELECT y.id, y.quota_key, row_number() OVER () AS o FROM (
                SELECT x.id, x.quota_key FROM tasks x
                WHERE x.queue = p_queue AND x.state = 'pending' AND x.due_at <= v_due_cut
                ORDER BY x.priority DESC, x.continuation DESC, x.due_at, x.id
                LIMIT p_n FOR UPDATE SKIP LOCKED) y)
        SELECT picked.id FROM picked
        WHERE picked.o < coalesce((SELECT min(q.o) FROM picked q WHERE q.quota_key <> ''), p_n + 1)
        ORDER BY picked.o), NULL, p_worker, p_lease);
END
$$;
