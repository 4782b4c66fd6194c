-- The waiting run of a group, locked: a cancel of it (runstore.Cancel)
-- either finished before, and the group must not fire, or waits for the
-- firing and then finds the run it became. notify passes to the run the
-- group fires.
SELECT pk, status, notify FROM runs WHERE tenant = $1 AND id = $2 FOR UPDATE
