-- The queue's fair lock, in a statement of its own so that what follows
-- reads the state the previous holder committed.
SELECT harvest_queue_lock($1)
