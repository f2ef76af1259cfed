-- pkgq 0014: a replay applies a message once, for ever.
--
-- A dead letter whose message its consumer applies later for the same user (a resend, a copy
-- that came again, a replay) is marked `superseded`, whatever its status (buried; replayed or
-- discarded, which a forced replay would send again), in the statement that records the
-- message in the inbox; and a dead letter filed for a message its consumer had applied
-- already is filed `superseded`. A superseded dead letter is never replayed, whatever the
-- inbox's retention has forgotten since: the dead letter itself is the durable record. (Rows filed before this migration keep their
-- status: their messages applied since are known only to the inbox, while it keeps them.)
ALTER TYPE telecom.dead_letter_status ADD VALUE IF NOT EXISTS 'superseded';
ALTER TABLE telecom.dead_letters ADD COLUMN superseded_at timestamptz;
-- The claim finds the dead letters of the messages it records by this. (Not a partial index
-- on the status: a value added to an enum cannot be used in the transaction that adds it.)
CREATE INDEX dead_letters_message ON telecom.dead_letters (message_uuid);
