-- pkgq 0022: a message is its own. Its identity is (consumer, message_id, first publisher as
-- the broker verified it, the user its body names), not a message_id anyone can choose.
--
-- Every piece of bookkeeping that used to be matched on the message_id alone is matched on a
-- key derived from that identity (`telecom.message_key`, computed the same way by
-- events/identity.py): the inbox, the attempt counts, TTR strikes, parked messages, a hold's
-- blocker, a dead letter, and the cancel key of a pending retry. A copy of a message_id sent by
-- another publisher, or for another user, has another key: it can neither make the first a
-- duplicate, share its attempts, lift its hold, withdraw its retry nor overwrite its dead letter.
--
-- Rows written before this migration: holds, parked messages, dead letters and pending retries
-- get their key from what they recorded (the first publisher kept in `x-pkgq-publisher` or the
-- dead letter's `publisher`, the user). The inbox, attempts and strikes never recorded their
-- publisher: their old rows keep the message_id as their key, and the batch's read still finds
-- an inbox row keyed so (a message applied before the upgrade and redelivered after it is a
-- duplicate), until the inbox's retention forgets it. An attempt count or TTR strike of a
-- message failing across the upgrade starts again.
CREATE FUNCTION telecom.message_key(message_id uuid, publisher text, user_id uuid)
RETURNS uuid LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN md5(message_id::text || '|' || coalesce(publisher, 'unverified') || '|'
           || coalesce(user_id::text, ''))::uuid;

ALTER TABLE telecom.inbox ADD COLUMN message_key uuid;
UPDATE telecom.inbox SET message_key = message_id;
ALTER TABLE telecom.inbox ALTER COLUMN message_key SET NOT NULL;
ALTER TABLE telecom.inbox DROP CONSTRAINT inbox_pkey;
ALTER TABLE telecom.inbox ADD PRIMARY KEY (consumer, message_key);
-- `pkgq message find` and the timeline look a message up by the id people see.
CREATE INDEX inbox_message ON telecom.inbox (consumer, message_id);

ALTER TABLE telecom.attempts ADD COLUMN message_key uuid;
UPDATE telecom.attempts SET message_key = message_id;
ALTER TABLE telecom.attempts ALTER COLUMN message_key SET NOT NULL;
ALTER TABLE telecom.attempts DROP CONSTRAINT attempts_pkey;
ALTER TABLE telecom.attempts ADD PRIMARY KEY (consumer, message_key, generation);
CREATE INDEX attempts_message ON telecom.attempts (consumer, message_id);

ALTER TABLE telecom.ttr_strikes ADD COLUMN message_key uuid;
UPDATE telecom.ttr_strikes SET message_key = message_id;
ALTER TABLE telecom.ttr_strikes ALTER COLUMN message_key SET NOT NULL;
ALTER TABLE telecom.ttr_strikes DROP CONSTRAINT ttr_strikes_pkey;
ALTER TABLE telecom.ttr_strikes ADD PRIMARY KEY (consumer, message_key);

ALTER TABLE telecom.parked ADD COLUMN message_key uuid;
UPDATE telecom.parked
SET message_key = telecom.message_key(message_id, headers ->> 'x-pkgq-publisher', user_id);
ALTER TABLE telecom.parked ALTER COLUMN message_key SET NOT NULL;
ALTER TABLE telecom.parked DROP CONSTRAINT parked_consumer_message_id_key;
ALTER TABLE telecom.parked ADD CONSTRAINT parked_consumer_message_key UNIQUE (consumer, message_key);
CREATE INDEX parked_message ON telecom.parked (consumer, message_id);

ALTER TABLE telecom.dead_letters ADD COLUMN message_key uuid;
UPDATE telecom.dead_letters
SET message_key = telecom.message_key(message_uuid, publisher, user_id)
WHERE message_uuid IS NOT NULL;
CREATE INDEX dead_letters_message_key ON telecom.dead_letters (consumer, message_key);
-- A filed dead letter is a record, not a slot: a later filing of the same message (the same
-- bytes under the same key) counts as a repeat only while the first is still buried; once an
-- operator replayed or discarded it (or it was superseded), a new filing is a row of its own,
-- and the operator's decision stands. A broker's dead letter delivered twice stays one event.
ALTER TABLE telecom.dead_letters DROP CONSTRAINT dead_letters_dedup_key_key;
CREATE UNIQUE INDEX dead_letters_dedup_key ON telecom.dead_letters (dedup_key)
WHERE status = 'buried' OR source <> 'consumer';

-- A hold's blocker by its key; `blocker` stays the message_id people see and type.
ALTER TABLE telecom.holds ADD COLUMN blocker_key uuid;
UPDATE telecom.holds h
SET blocker_key = telecom.message_key(
    h.blocker,
    coalesce(
        (SELECT o.headers ->> 'x-pkgq-publisher' FROM telecom.outbox o
         WHERE o.published_at IS NULL
           AND o.cancel_key = 'retry:' || h.consumer || ':' || h.user_id || ':' || h.blocker
         LIMIT 1),
        (SELECT d.publisher FROM telecom.dead_letters d
         WHERE d.consumer = h.consumer AND d.user_id = h.user_id AND d.message_uuid = h.blocker
         ORDER BY d.id DESC LIMIT 1)
    ),
    h.user_id)
WHERE h.blocker IS NOT NULL;
DROP INDEX telecom.holds_blocker;
CREATE INDEX holds_blocker ON telecom.holds (consumer, blocker_key);

-- A pending retry's cancel key names its consumer and its message's key.
UPDATE telecom.outbox
SET cancel_key = 'retry:' || split_part(cancel_key, ':', 2) || ':'
                 || telecom.message_key(message_id, headers ->> 'x-pkgq-publisher', user_id)
WHERE published_at IS NULL AND cancel_key LIKE 'retry:%:%:%';
