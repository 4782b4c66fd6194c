-- A later member of a batch: its input joins the list, in arrival order.
UPDATE deferred_groups
SET input = coalesce(input, '[]'::jsonb) || jsonb_build_array($2::jsonb), size = size + 1
WHERE pk = $1
RETURNING size, max_size
