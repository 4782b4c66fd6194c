-- Which of the tenant's run ids $2 this shard holds already.
SELECT id FROM runs WHERE tenant = $1 AND id = ANY ($2::text[])
