-- Whether the server runs autovacuum (the worker warns when it does not).
SELECT current_setting('autovacuum')::boolean
