-- pkgq: no-transaction
-- pkgq 0021: the hand-off of a batch's follow-up events to the process that committed them
-- (infra/outbox/handoff.py). Expand only: a nullable column and an index built CONCURRENTLY, so
-- the previous release runs unchanged against this schema during a rolling update (it writes no
-- hand-offs, and its relay, which does not know them, may publish a handed-off row as well: a
-- copy the consumers' inbox drops, after the first, in the user's order).

-- Until then, the process that wrote the row publishes it itself, right after its commit; the
-- relay leaves the row, and every later row of its user, alone until it is published or this
-- time has passed. NULL: the relay's from the start.
ALTER TABLE telecom.outbox ADD COLUMN IF NOT EXISTS handed_until timestamptz;
-- Which process it was handed off to (an id each process draws at start): a later row of the
-- same user may be handed off to that same process while the row is under way there, which
-- publishes the two in order.
ALTER TABLE telecom.outbox ADD COLUMN IF NOT EXISTS handed_by uuid;

-- A user's unpublished rows, in order: whether a batch may hand a user's rows off (none of
-- the user's earlier rows waits), and which rows the relay must leave behind a hand-off.
CREATE INDEX CONCURRENTLY IF NOT EXISTS outbox_user_unpublished ON telecom.outbox (user_id, id)
    WHERE published_at IS NULL;
