SELECT harvest_heartbeat($1, $2, $3::bigint * interval '1 microsecond')
