-- Sent after a start group's transaction, which committed with
-- synchronous_commit off so that its locks were free at once: a
-- transaction of its own that writes WAL and commits synchronously, so it
-- returns once the WAL is flushed past the group's commit. Only then are
-- the group's starts answered. The message means nothing to anything but
-- logical decoding, which may skip the prefix 'harvest.flush' (the fair
-- claim's WalFlush sends the same).
SELECT pg_logical_emit_message(true, 'harvest.flush', '')
