-- Delete the moved runs $1 here (their tasks and move_out rows go with
-- them) and say which were unfinished, to lower the count.
DELETE FROM runs WHERE pk = ANY ($1::bigint[])
RETURNING finished_at IS NULL AS unfinished
