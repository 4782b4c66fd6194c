-- The move is over: nothing of the tenant is counted elsewhere.
DELETE FROM tenant_away WHERE tenant = $1
