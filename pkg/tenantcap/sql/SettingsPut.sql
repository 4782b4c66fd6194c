-- Write the new value and return the database clock of the change.
UPDATE settings SET value = $2::jsonb, updated_at = now(), updated_by = $3
WHERE name = $1
RETURNING updated_at
