-- A refused change: $1 actor, $2 action, $3 queue, $4 key, $5 old value,
-- $6 attempted value, $7 message, $9 HTTP status, folded into the latest
-- refused row of the same actor, action and status when it is younger
-- than $8 (see harvest_audit_refused).
SELECT harvest_audit_refused($1, $2, $3, $4, $5::jsonb, $6::jsonb, $7, $8::interval, $9::integer) AS id
