-- Lock every running-count row in a fixed order (the janitor's order), so no
-- start or finish changes a count between the recount and its write.
SELECT tenant FROM tenant_running ORDER BY tenant FOR UPDATE
