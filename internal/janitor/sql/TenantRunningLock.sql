-- Lock every running-count row, in a fixed order, so no start or finish can
-- change a count between the count below and its write.
SELECT tenant FROM tenant_running ORDER BY tenant FOR UPDATE
