-- Lock the count rows of p_tenants (any order, repeats allowed) in byte
-- order (COLLATE "C"), then the shard_running stripes their falls go to,
-- ascending: the lock order of every transaction that holds several
-- tenants' counts (see harvest_running_total). Call it before lowering
-- the counts of several tenants: a completion batch, the rescue of
-- expired leases. Rows that do not exist are skipped.
CREATE OR REPLACE FUNCTION harvest_running_lock(p_tenants text[]) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF coalesce(cardinality(p_tenants), 0) = 0 THEN
        RETURN;
    END IF;
    PERFORM 1 FROM tenant_running c WHERE c.tenant = ANY (p_tenants)
    ORDER BY c.tenant COLLATE "C" FOR NO KEY UPDATE;
    PERFORM 1 FROM shard_running s
    WHERE s.stripe IN (SELECT harvest_running_stripe(t) FROM unnest(p_tenants) AS t)
    ORDER BY s.stripe FOR NO KEY UPDATE;
END
$$;
