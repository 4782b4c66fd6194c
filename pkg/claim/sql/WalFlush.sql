-- Sent after a fair claim that committed with synchronous_commit off (to
-- free the queue's fair lock before the flush): when that claim took a
-- task (it set harvest.flush), a transaction of its own that writes WAL and
-- commits synchronously, so it returns once the WAL is flushed past the
-- claim's commit. The message is a no-op for everything but logical
-- decoding, which may skip the prefix 'harvest.flush'.
SELECT CASE WHEN current_setting('harvest.flush', true) = 'on'
            THEN pg_logical_emit_message(true, 'harvest.flush', '') END,
       set_config('harvest.flush', '', false)
