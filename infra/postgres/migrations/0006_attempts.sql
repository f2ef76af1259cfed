-- pkgq 0006: headers are data, not trust.
--
-- Attempts are counted here, not read from x-attempt (anyone who publishes sets that header):
-- one row per consumer, message and replay generation, written only when a handler fails, so
-- the successful path pays nothing for it. last_claim is the x-attempt of the delivery counted
-- last: the same delivery again (a redelivery after a crash between commit and ack) is not
-- counted twice. A claim is only ever compared, never believed as a count.
CREATE TABLE telecom.attempts (
    consumer   text        NOT NULL,
    message_id uuid        NOT NULL,
    generation integer     NOT NULL DEFAULT 0,
    attempts   integer     NOT NULL,
    last_claim integer     NOT NULL,
    last_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, message_id, generation)
);

-- A dead letter's body is kept up to its first 64 KiB; its full size and sha256 say what it was.
-- repeats counts later filings of the same dead message, which never replace what was stored.
ALTER TABLE telecom.dead_letters
    ADD COLUMN body_size   bigint,
    ADD COLUMN body_sha256 text,
    ADD COLUMN repeats     integer NOT NULL DEFAULT 0;
