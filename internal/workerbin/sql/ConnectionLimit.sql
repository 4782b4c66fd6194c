-- How many connections the server accepts from ordinary roles: its
-- max_connections less the slots kept for superusers (the worker warns
-- when its pool may open more).
SELECT current_setting('max_connections')::integer
       - current_setting('superuser_reserved_connections')::integer
