-- Take runs ($1) of tenant $2 off this shard's claimers and cancels, on
-- their way to shard $3.
INSERT INTO move_out (run_pk, tenant, moved_to)
SELECT pk, $2, $3 FROM unnest($1::bigint[]) AS u (pk)
ON CONFLICT (run_pk) DO NOTHING
