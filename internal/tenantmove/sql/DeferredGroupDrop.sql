-- Delete deferred groups $1 here; their member starts go with them.
DELETE FROM deferred_groups WHERE pk = ANY ($1::bigint[])
