-- A transaction of its own that writes WAL and commits synchronously, so
-- its commit waits until the WAL is flushed past every commit made before
-- it: after it returns, a fair claim committed with synchronous_commit off
-- (to free the queue's fair lock before the flush) is durable. The message
-- is a no-op for everything but logical decoding, which may skip the
-- prefix 'harvest.flush'.
SELECT pg_logical_emit_message(true, 'harvest.flush', '')
