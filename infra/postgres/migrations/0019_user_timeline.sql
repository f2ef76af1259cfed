-- pkgq: no-transaction
-- pkgq 0019: a user's timeline. Expand only: one nullable column and indexes built
-- CONCURRENTLY, so the previous release runs unchanged against this schema during a rolling
-- update (it leaves the new column NULL: those messages are missing from the timeline).

-- Which user a consumer's applied message was for: the inbox knew only the message_id, so
-- "every command received for this user" could not be read from it. Written by the batch's
-- claim (infra/postgres/inbox.py claim_many), NULL for a message with no user.
ALTER TABLE telecom.inbox ADD COLUMN IF NOT EXISTS user_id uuid;

-- One index per timeline source on (user_id, its time): each source is a short backward range
-- scan of its own index, whatever the table's size (infra/postgres/timeline.py).
CREATE INDEX CONCURRENTLY IF NOT EXISTS inbox_user ON telecom.inbox (user_id, processed_at)
    WHERE user_id IS NOT NULL;
CREATE INDEX CONCURRENTLY IF NOT EXISTS outbox_user ON telecom.outbox (user_id, created_at, id)
    WHERE user_id IS NOT NULL;
CREATE INDEX CONCURRENTLY IF NOT EXISTS usage_billed_user ON telecom.usage_billed
    (user_id, billed_at);
CREATE INDEX CONCURRENTLY IF NOT EXISTS parked_user_time ON telecom.parked (user_id, parked_at);
CREATE INDEX CONCURRENTLY IF NOT EXISTS holds_user ON telecom.holds (user_id, since);

-- Finding a message_id wherever it is (`pkgq find`, the console's message search): the inbox,
-- parked messages, holds and attempts are searched through their keys, consumer by consumer;
-- these three had no index that starts with the message_id.
CREATE INDEX CONCURRENTLY IF NOT EXISTS item_audit_message ON telecom.item_audit (message_id);
CREATE INDEX CONCURRENTLY IF NOT EXISTS operator_actions_message ON telecom.operator_actions
    (message_id) WHERE message_id IS NOT NULL;
CREATE INDEX CONCURRENTLY IF NOT EXISTS usage_billed_message ON telecom.usage_billed (message_id);
