-- pkgq 0002: the failure path. Retries and replays are outbox rows; dead letters, holds and parked
-- messages are their own tables.

-- A message may now have several outbox rows: its first publish, its delayed retries, its replays.
-- dedup_key keeps each of those from being written twice (a redelivered failure, a re-run replay).
ALTER TABLE telecom.outbox DROP CONSTRAINT outbox_message_id_key;
CREATE INDEX outbox_message_id ON telecom.outbox (message_id);
ALTER TABLE telecom.outbox ADD COLUMN dedup_key text;
CREATE UNIQUE INDEX outbox_dedup_key ON telecom.outbox (dedup_key) WHERE dedup_key IS NOT NULL;

CREATE TYPE telecom.dead_letter_status AS ENUM ('buried', 'replayed', 'discarded');

-- The dead-letter store: every message that could not be applied, with why, and what was done
-- about it. dedup_key identifies one dead message (consumer + message_id, or a hash of the raw
-- message when it has no usable id), so a redelivered failure updates its row instead of adding
-- another.
CREATE TABLE telecom.dead_letters (
    id              bigserial PRIMARY KEY,
    dedup_key       text                        NOT NULL UNIQUE,
    source          text                        NOT NULL CHECK (source IN ('consumer', 'broker')),
    route           text                        NOT NULL,
    consumer        text                        NOT NULL,
    message_id      text,
    user_id         uuid,
    message_type    text,
    content_type    text,
    body            bytea                       NOT NULL,
    headers         jsonb                       NOT NULL DEFAULT '{}'::jsonb,
    reason          text                        NOT NULL,
    error_type      text                        NOT NULL,
    error_message   text                        NOT NULL,
    error_location  text                        NOT NULL DEFAULT '',
    traceback       text,
    group_key       text                        NOT NULL GENERATED ALWAYS AS
                        (left(md5(reason || '|' || error_type || '|' || error_location), 10)) STORED,
    attempts        integer                     NOT NULL DEFAULT 1,
    first_failed_at timestamptz                 NOT NULL DEFAULT now(),
    last_failed_at  timestamptz                 NOT NULL DEFAULT now(),
    status          telecom.dead_letter_status  NOT NULL DEFAULT 'buried',
    replay_count    integer                     NOT NULL DEFAULT 0,
    replayed_at     timestamptz,
    replayed_by     text,
    discarded_at    timestamptz,
    discarded_by    text
);
CREATE INDEX dead_letters_status_failed ON telecom.dead_letters (status, first_failed_at, id);
CREATE INDEX dead_letters_group ON telecom.dead_letters (group_key);
CREATE INDEX dead_letters_route ON telecom.dead_letters (route, first_failed_at);

-- A hold keeps one user's later messages on one consumer from overtaking a message that waits
-- for a retry or lies buried. blocker NULL: released, its parked messages are being applied.
CREATE TABLE telecom.holds (
    consumer   text        NOT NULL,
    user_id    uuid        NOT NULL,
    blocker    uuid,
    state      text        NOT NULL CHECK (state IN ('retrying', 'buried', 'releasing')),
    attempts   integer     NOT NULL DEFAULT 0,
    last_error text,
    since      timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, user_id)
);
CREATE INDEX holds_releasing ON telecom.holds (consumer) WHERE blocker IS NULL;
CREATE INDEX holds_blocker ON telecom.holds (consumer, blocker);

-- Messages parked behind a hold, in arrival order (id).
CREATE TABLE telecom.parked (
    id           bigserial PRIMARY KEY,
    consumer     text        NOT NULL,
    user_id      uuid        NOT NULL,
    message_id   uuid        NOT NULL,
    route        text        NOT NULL,
    message_type text        NOT NULL,
    body         bytea       NOT NULL,
    headers      jsonb       NOT NULL DEFAULT '{}'::jsonb,
    parked_at    timestamptz NOT NULL DEFAULT now(),
    UNIQUE (consumer, message_id)
);
CREATE INDEX parked_user ON telecom.parked (consumer, user_id, id);
