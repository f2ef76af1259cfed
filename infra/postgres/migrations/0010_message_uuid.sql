-- pkgq 0010: a dead letter's message_id as the UUID a hold names its blocker by.
-- A dead letter keeps its message_id as the text it came with; a hold's blocker is that id as
-- pkgq's decoding parsed it (Python's uuid.UUID: any case, hyphens or not, braces, ...).
-- Comparing `blocker::text = message_id` missed every id not written in the canonical
-- lower-case form, and could use no index. `bury` now stores the id parsed the same way
-- (NULL when it is not a UUID, as then no hold can name it), and every match is on uuids.
ALTER TABLE telecom.dead_letters ADD COLUMN message_uuid uuid;

-- Rows filed before: their ids in the canonical form, in any case (the others stay NULL).
UPDATE telecom.dead_letters SET message_uuid = message_id::uuid
WHERE message_id ~ '^[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}$';
