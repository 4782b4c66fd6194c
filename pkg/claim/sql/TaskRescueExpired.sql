SELECT rescued, failed FROM harvest_rescue_expired($1)
