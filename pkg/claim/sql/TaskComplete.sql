SELECT harvest_complete($1, $2, $3)
