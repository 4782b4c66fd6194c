-- The group weights set in queue $1 on this shard, by group name, at most
-- $2 of them.
SELECT grp AS "group", weight FROM group_weights WHERE queue = $1 ORDER BY grp LIMIT $2
