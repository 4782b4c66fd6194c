-- Whether a move is copying the run to another shard (move_out). Sent
-- after the statement that locked the run's row, so it sees a move that
-- held the row before.
SELECT EXISTS (SELECT 1 FROM move_out WHERE run_pk = $1)
