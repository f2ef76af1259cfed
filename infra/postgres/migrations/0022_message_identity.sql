-- pkgq 0022: a message is its own. Its identity is (consumer, message_id, first publisher as
-- the broker verified it, the user its body names), not a message_id anyone can choose.
--
-- Every piece of bookkeeping that was matched on the message_id alone is matched on a key
-- derived from that identity (`telecom.message_key`, computed the same way by
-- events/identity.py): the inbox, the attempt counts, TTR strikes, parked messages, a hold's
-- blocker, a dead letter, and the cancel key of a pending retry. A copy of a message_id sent by
-- another publisher, or for another user, has another key: it can neither make the first a
-- duplicate, share its attempts, lift its hold, withdraw its retry nor overwrite its dead letter.
--
-- Expand only, so that the previous release runs unchanged beside this one during a rolling
-- update:
-- - The inbox, attempts, TTR strikes and parked messages keep their keys as they are: this
--   release writes the message's key where the previous one wrote its message_id (the unique
--   keys then hold per message, not per message_id), and the message_id it was sent under in
--   `sent_as`. A row with `sent_as` NULL is the previous release's, keyed by its message_id:
--   the inbox still counts it as applied, and its parked message is still drained.
-- - A hold keeps its `blocker` (the message_id people see and type) and gains `blocker_key`,
--   valid while `blocker_key_of` is the blocker it was worked out for (the previous release
--   moves `blocker` alone); `telecom.blocker_key` reads it, and works out the key of a hold
--   the previous release made from its blocker's pending retry or buried dead letter.
-- - A dead letter gains `message_key`. Pending retries are given cancel keys that name it.
CREATE FUNCTION telecom.message_key(message_id uuid, publisher text, user_id uuid)
RETURNS uuid LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN md5(replace(message_id::text, '-', '') || '|' || coalesce(publisher, 'unverified') || '|'
           || coalesce(replace(user_id::text, '-', ''), ''))::uuid;

ALTER TABLE telecom.inbox ADD COLUMN sent_as uuid;
ALTER TABLE telecom.attempts ADD COLUMN sent_as uuid;
ALTER TABLE telecom.parked ADD COLUMN sent_as uuid;
ALTER TABLE telecom.ttr_strikes ADD COLUMN sent_as uuid;

ALTER TABLE telecom.dead_letters ADD COLUMN message_key uuid;
UPDATE telecom.dead_letters
SET message_key = telecom.message_key(message_uuid, publisher, user_id)
WHERE message_uuid IS NOT NULL;

ALTER TABLE telecom.holds ADD COLUMN blocker_key uuid;
ALTER TABLE telecom.holds ADD COLUMN blocker_key_of uuid;

-- The key of a hold's blocker: as this release wrote it, else (a hold the previous release
-- made or moved) worked out from what the blocker's own way out recorded of its publisher.
CREATE FUNCTION telecom.blocker_key(
    p_consumer text, p_user_id uuid, p_blocker uuid, p_key uuid, p_key_of uuid
) RETURNS uuid LANGUAGE sql STABLE PARALLEL SAFE
RETURN CASE
    WHEN p_blocker IS NULL THEN NULL
    WHEN p_key_of = p_blocker THEN p_key
    ELSE telecom.message_key(
        p_blocker,
        coalesce(
            -- its latest retry, published or not (a published one is still on its way)
            (SELECT o.headers ->> 'x-pkgq-publisher' FROM telecom.outbox o
             WHERE o.message_id = p_blocker AND o.user_id = p_user_id
               AND o.route = 'telecom.' || p_consumer AND o.cancel_key LIKE 'retry:%'
             ORDER BY o.id DESC LIMIT 1),
            (SELECT d.publisher FROM telecom.dead_letters d
             WHERE d.consumer = p_consumer AND d.user_id = p_user_id
               AND d.message_uuid = p_blocker
             ORDER BY d.id DESC LIMIT 1)),
        p_user_id)
END;

UPDATE telecom.holds h
SET blocker_key = telecom.blocker_key(h.consumer, h.user_id, h.blocker, NULL, NULL),
    blocker_key_of = h.blocker
WHERE h.blocker IS NOT NULL;

-- A pending retry's cancel key names its consumer and its message's key.
UPDATE telecom.outbox
SET cancel_key = 'retry:' || split_part(cancel_key, ':', 2) || ':'
                 || telecom.message_key(message_id, headers ->> 'x-pkgq-publisher', user_id)
WHERE published_at IS NULL AND cancel_key LIKE 'retry:%:%:%';
