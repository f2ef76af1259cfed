-- pkgq 0013: who published a message, kept as the broker verified it.
--
-- dead_letters.publisher: the AMQP user_id of whoever published the dead message first, as
-- RabbitMQ validated it (pkgq's own copies, retries and replays, carry it in the pkgq-only
-- header x-pkgq-publisher), or 'unverified' when the delivery had none. A replay of a message
-- that anyone but pkgq published on a route only pkgq may publish is refused
-- (infra/postgres/replay.py). Rows filed before this migration have NULL: unknown, treated as
-- unverified.
--
-- item_audit.publisher: the verified publisher of the command beside the `operator` its body
-- claims (the body is the publisher's word; the publisher is the broker's).
--
-- The runtime role's grants are on the tables (telecom.grant_runtime): new columns need none.
ALTER TABLE telecom.dead_letters ADD COLUMN publisher text;
ALTER TABLE telecom.item_audit ADD COLUMN publisher text;
