-- $2 of the tenant's runs counted away arrived here.
UPDATE tenant_away SET runs = greatest(0, runs - $2) WHERE tenant = $1
