-- pkgq 0005: billing-grade terms. Items keep the terms they were bought with, a catalog entry
-- can be retired, plans may have no traffic limit, an order is bought once, and cancels and
-- quota adjustments are recorded with who did them and why.

-- The catalog: traffic_limit NULL is unlimited traffic (a time-only plan). An entry without a
-- limit and without a duration would hold its user's queue forever, so one of them is needed.
ALTER TABLE telecom.packages ALTER COLUMN traffic_limit DROP NOT NULL;
ALTER TABLE telecom.packages ADD CONSTRAINT packages_some_limit
    CHECK (traffic_limit IS NOT NULL OR duration IS NOT NULL);
-- A retired entry sells no more; items bought before keep their terms.
ALTER TABLE telecom.packages ADD COLUMN retired_at timestamptz;

-- The terms each item was bought with, copied from the catalog at purchase: a later catalog
-- edit changes only later purchases. Existing items take the catalog's terms as they are now
-- (until today they were read through a join, so these are the terms they have been living by).
ALTER TABLE telecom.package_queue
    ADD COLUMN package_name  text,
    ADD COLUMN traffic_limit bigint CHECK (traffic_limit >= 0),
    ADD COLUMN duration      interval CHECK (duration >= interval '0');
UPDATE telecom.package_queue q
SET package_name = p.name, traffic_limit = p.traffic_limit, duration = p.duration
FROM telecom.packages p
WHERE p.id = q.package_id;
ALTER TABLE telecom.package_queue ALTER COLUMN package_name SET NOT NULL;
-- pkgq writes the terms with every new item. A row inserted without them (package_name NULL:
-- bulk loads, seeding, other tools) takes the catalog's terms at insert, which is its purchase.
CREATE FUNCTION telecom.package_queue_default_terms() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.package_name IS NULL THEN
        SELECT p.name, p.traffic_limit, p.duration
        INTO NEW.package_name, NEW.traffic_limit, NEW.duration
        FROM telecom.packages p WHERE p.id = NEW.package_id;
    END IF;
    RETURN NEW;
END;
$$;
CREATE TRIGGER package_queue_default_terms BEFORE INSERT ON telecom.package_queue
    FOR EACH ROW EXECUTE FUNCTION telecom.package_queue_default_terms();
ALTER TABLE telecom.package_queue ADD CONSTRAINT package_queue_some_limit
    CHECK (traffic_limit IS NOT NULL OR duration IS NOT NULL);

-- Orders: one purchase per (user, by_order), whatever its message id. The purchase consumer
-- loads the orders its batch names (items of an old order may be consumed and no longer loaded)
-- and writes the new ones in the same transaction; the key refuses a second one outright.
CREATE TABLE telecom.orders (
    user_id    uuid        NOT NULL,
    by_order   uuid        NOT NULL,
    item_ids   bigint[]    NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (user_id, by_order)
);
-- Orders bought before this migration, from their items (an order resent before it was
-- deduplicated queued twice: both sets of items are that order's).
INSERT INTO telecom.orders (user_id, by_order, item_ids, created_at)
SELECT user_id, by_order, array_agg(id ORDER BY id), min(created_at)
FROM telecom.package_queue
WHERE by_order IS NOT NULL
GROUP BY user_id, by_order;

-- Who cancelled or adjusted what, and why: one row per applied command.
CREATE TABLE telecom.item_audit (
    id         bigserial PRIMARY KEY,
    item_id    bigint      NOT NULL,
    user_id    uuid        NOT NULL,
    action     text        NOT NULL CHECK (action IN ('cancel', 'adjust_quota')),
    delta      bigint,
    reason     text,
    operator   text,
    message_id uuid        NOT NULL,
    at         timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX item_audit_item ON telecom.item_audit (item_id);
CREATE INDEX item_audit_user ON telecom.item_audit (user_id, at);
