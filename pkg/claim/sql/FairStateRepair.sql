-- Rebuild the key heads of queue $1 (see harvest_fair_repair).
SELECT repaired, refreshed FROM harvest_fair_repair($1)
