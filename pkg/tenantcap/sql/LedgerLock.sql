-- The ledger's lock (harvest_ledger_lock), taken by every grant before it
-- reads the ledger: grants are judged one at a time.
SELECT harvest_ledger_lock()
