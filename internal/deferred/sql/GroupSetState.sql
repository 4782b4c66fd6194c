-- Close a group: fired (its run started) or cancelled (its run was
-- cancelled while it waited).
UPDATE deferred_groups SET state = $2, fired_at = $3 WHERE pk = $1
