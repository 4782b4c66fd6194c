-- Set (weight $3) or clear ($3 NULL) the weight of group $2 in queue $1 on
-- this shard, audited as actor $4 (harvest_group_weight_set).
SELECT old_weight FROM harvest_group_weight_set($1, $2, $3, $4)
