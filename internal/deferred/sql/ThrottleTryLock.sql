-- ThrottleLock for a firer: skip the key when someone else holds it.
SELECT pg_try_advisory_xact_lock(hashtextextended('harvest.throttle' || chr(1) || $1 || chr(1) || $2 || chr(1) || $3, 0))
