-- pkgq 0014: a replay applies a message once, for ever.
--
-- A buried dead letter whose message_id its consumer applies later (a resend, a copy that came
-- again) is marked `superseded` in the statement that records the message in the inbox, and a
-- dead letter filed for a message its consumer had applied already is filed `superseded`. A
-- superseded dead letter is never replayed, whatever the inbox's retention has forgotten since:
-- the dead letter itself is the durable record. (Rows filed before this migration keep their
-- status: their messages applied since are known only to the inbox, while it keeps them.)
ALTER TYPE telecom.dead_letter_status ADD VALUE IF NOT EXISTS 'superseded';
ALTER TABLE telecom.dead_letters ADD COLUMN superseded_at timestamptz;
-- The claim finds the buried dead letters of the messages it records by this (small: only the
-- buried rows).
CREATE INDEX dead_letters_buried_message ON telecom.dead_letters (message_uuid)
    WHERE status = 'buried';
