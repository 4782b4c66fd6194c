-- One audit row: $1 actor, $2 action, $3 old value, $4 new value,
-- $5 outcome, $6 message.
INSERT INTO audit (actor, action, old_value, new_value, outcome, message)
VALUES ($1, $2, $3::jsonb, $4::jsonb, $5, $6)
