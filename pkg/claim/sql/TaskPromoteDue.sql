SELECT harvest_promote_due($1, $2, $3)
