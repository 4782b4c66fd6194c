-- The shard's tables whose statistics fell behind their writes, most
-- changed first, at most $4: those written $1 rows plus $2 of their rows
-- since their last analyze, and not analyzed (by autovacuum or by hand)
-- in the last $3 microseconds. The names come quoted, ready for ANALYZE.
-- Only tables this role may analyze (it owns them, or is a superuser):
-- ANALYZE skips any other with a warning, which would come every tick.
--
-- The thresholds sit above autovacuum's own (50 rows and 10%, or 2% for
-- runs and tasks), and the age keeps a janitor off a table autovacuum has
-- just done: on a server where autovacuum keeps up this finds nothing.
SELECT format('%I.%I', s.schemaname, s.relname) AS name
FROM pg_stat_user_tables s
JOIN pg_class c ON c.oid = s.relid
WHERE s.schemaname = current_schema()
  AND pg_has_role(c.relowner, 'MEMBER')
  AND s.n_mod_since_analyze >= $1::bigint + $2::float8 * greatest(c.reltuples, 0)
  AND coalesce(greatest(s.last_analyze, s.last_autoanalyze), '-infinity') < now() - $3::bigint * interval '1 microsecond'
ORDER BY s.n_mod_since_analyze DESC
LIMIT $4
