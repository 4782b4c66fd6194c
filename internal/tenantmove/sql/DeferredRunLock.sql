-- Lock the tenant's runs that wait as deferred starts here.
SELECT pk FROM runs WHERE tenant = $1 AND status = 'deferred' ORDER BY pk FOR UPDATE
