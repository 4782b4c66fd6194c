-- Every refused change folds (harvest_audit_refused): within a window, the
-- further refusals of one actor at one action with the same HTTP status
-- raise the repeats of the first row instead of adding rows. The status is
-- part of what makes two refusals the same (a 400 and a 429 of one caller
-- are different stories); last_at is when the row's latest refusal came
-- (NULL: its only one, at at).
ALTER TABLE audit ADD COLUMN status integer NOT NULL DEFAULT 0;
ALTER TABLE audit ADD COLUMN last_at timestamptz;
