-- pkgq 0016: RecordUsage version 2. Expand only: one new table, nothing changed or
-- dropped, so the previous release runs unchanged against this schema during a rolling update.

-- Usage records billed under their billing system's own record id: a record naming one of
-- these again, under any message_id, bills nothing (`duplicate_usage`) until keep_until, set
-- when it was billed from PKGQ_USAGE_DEDUP_DAYS (35 by default); retention prunes it after.
-- Written in the billing batch's transaction, under the user's row lock, so two batches never
-- bill one record id of a user twice; the key refuses what a bug would let through.
CREATE TABLE telecom.usage_billed (
    user_id     uuid        NOT NULL,
    usage_id    text        NOT NULL CHECK (length(usage_id) BETWEEN 1 AND 128),
    message_id  uuid        NOT NULL,
    item_id     bigint,
    upload      bigint      NOT NULL CHECK (upload >= 0),
    download    bigint      NOT NULL CHECK (download >= 0),
    recorded_at timestamptz,
    billed_at   timestamptz NOT NULL DEFAULT now(),
    keep_until  timestamptz NOT NULL,
    PRIMARY KEY (user_id, usage_id)
);
COMMENT ON COLUMN telecom.usage_billed.item_id IS
    'The item the traffic was billed to; NULL: kept as the user''s unbilled usage';
COMMENT ON COLUMN telecom.usage_billed.recorded_at IS
    'When the traffic happened, as the billing system says (RecordUsage.recorded_at)';

CREATE INDEX usage_billed_keep_until ON telecom.usage_billed (keep_until);
