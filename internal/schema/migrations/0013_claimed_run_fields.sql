-- A claim hands back, with each task, what the worker needs of its run:
-- the tenant, the run's id, its workflow name, its status after the claim
-- (running, or final for a run cancelled while its task waited), its
-- max_attempts and its timeout (NULL: none). The claim writes the run row
-- anyway (harvest_claim_step, harvest_lease_rows), so these come from that
-- update; the worker's read of the runs after every claim is gone.
--
-- Added at the end of the type: the entry points' statements select the
-- type's fields by name, so a binary of the previous release keeps reading
-- the fields it knows.
ALTER TYPE harvest_claimed
    ADD ATTRIBUTE tenant       text,
    ADD ATTRIBUTE run_id       text,
    ADD ATTRIBUTE workflow     text,
    ADD ATTRIBUTE run_status   text,
    ADD ATTRIBUTE max_attempts integer,
    ADD ATTRIBUTE timeout_ms   bigint;
