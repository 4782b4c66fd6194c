-- Create the row with the defaults unless it exists. Waits for a concurrent
-- insert of the same row to commit.
INSERT INTO settings (name, value, updated_by) VALUES ($1, $2::jsonb, '')
ON CONFLICT (name) DO NOTHING
