-- pkgq 0010: a dead letter's message_id as the UUID a hold names its blocker by.
-- A dead letter keeps its message_id as the text it came with; a hold's blocker is that id
-- parsed as a UUID (Python's uuid.UUID: any case, with or without hyphens, braces or a
-- `urn:uuid:` prefix). Comparing `blocker::text = message_id` missed every id not written in
-- the canonical lower-case form, and could use no index. This reads the id as Python does,
-- and gives NULL for anything that is not 32 hex digits then, so no text can fail the cast.
CREATE FUNCTION telecom.message_uuid(message_id text) RETURNS uuid
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN digits ~ '^[0-9a-f]{32}$' THEN digits::uuid END
    FROM (SELECT replace(btrim(replace(replace(lower(message_id), 'urn:', ''), 'uuid:', ''),
                               '{}'), '-', '') AS digits) AS parsed
$$;
