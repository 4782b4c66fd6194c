-- Lock the tenant's deferred groups here, whatever their state.
SELECT pk FROM deferred_groups WHERE tenant = $1 ORDER BY pk FOR UPDATE
