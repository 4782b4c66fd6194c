-- Keeps weight_override_counts exact whatever statement writes
-- weight_overrides; the count's check enforces the cap of 1,000 per queue.
CREATE OR REPLACE FUNCTION harvest_weight_count() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP <> 'INSERT' THEN
        UPDATE weight_override_counts SET n = n - 1 WHERE queue = OLD.queue;
    END IF;
    IF TG_OP <> 'DELETE' THEN
        INSERT INTO weight_override_counts AS c (queue, n) VALUES (NEW.queue, 1)
        ON CONFLICT (queue) DO UPDATE SET n = c.n + 1;
    END IF;
    RETURN NULL;
END
$$;

CREATE OR REPLACE TRIGGER weight_overrides_count
    AFTER INSERT OR DELETE OR UPDATE OF queue ON weight_overrides
    FOR EACH ROW EXECUTE FUNCTION harvest_weight_count();
