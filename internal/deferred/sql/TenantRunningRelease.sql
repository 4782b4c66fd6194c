-- Hand a fired group's slot over to its run: the start of the run counted
-- it again.
UPDATE tenant_running SET running = greatest(running - 1, 0) WHERE tenant = $1
