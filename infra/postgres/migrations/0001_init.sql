-- pkgq 0001: the package queue, the per-user row, the outbox, the inbox, the access read model.
CREATE SCHEMA IF NOT EXISTS telecom;

CREATE TYPE telecom.package_status AS ENUM ('in_queue', 'active', 'consumed', 'cancelled');

-- The catalog. duration NULL: the package never expires by time.
CREATE TABLE telecom.packages (
    id            bigserial PRIMARY KEY,
    name          text        NOT NULL,
    traffic_limit bigint      NOT NULL CHECK (traffic_limit >= 0),
    duration      interval    CHECK (duration >= interval '0'),
    created_at    timestamptz NOT NULL DEFAULT now()
);

-- A PackageQueueItem, plus expire_at.
CREATE TABLE telecom.package_queue (
    id           bigserial PRIMARY KEY,
    user_id      uuid                   NOT NULL,
    package_id   bigint                 NOT NULL REFERENCES telecom.packages (id),
    by_order     uuid,
    status       telecom.package_status NOT NULL DEFAULT 'in_queue',
    created_at   timestamptz            NOT NULL DEFAULT now(),
    activated_at timestamptz,
    upload       bigint                 NOT NULL DEFAULT 0 CHECK (upload >= 0),
    download     bigint                 NOT NULL DEFAULT 0 CHECK (download >= 0),
    adjust_quota bigint                 NOT NULL DEFAULT 0,
    expire_at    timestamptz
);
-- The queue's three lookup indexes.
CREATE INDEX package_queue_user_status ON telecom.package_queue (user_id, status);
CREATE INDEX package_queue_user_status_created ON telecom.package_queue (user_id, status, created_at);
CREATE INDEX package_queue_package ON telecom.package_queue (package_id);
-- The database itself refuses a second active package for a user.
CREATE UNIQUE INDEX package_queue_one_active ON telecom.package_queue (user_id) WHERE status = 'active';
-- The expiry sweep looks for active items past expire_at.
CREATE INDEX package_queue_active_expiry ON telecom.package_queue (expire_at)
    WHERE status = 'active' AND expire_at IS NOT NULL;

-- One row per user: the row every transition locks, the per-user event sequence, unbilled usage,
-- and whether an AllPackageExpiredEvent is owed when access ends.
CREATE TABLE telecom.queue_users (
    user_id           uuid PRIMARY KEY,
    seq               bigint      NOT NULL DEFAULT 0,
    unbilled_upload   bigint      NOT NULL DEFAULT 0 CHECK (unbilled_upload >= 0),
    unbilled_download bigint      NOT NULL DEFAULT 0 CHECK (unbilled_download >= 0),
    has_access        boolean     NOT NULL DEFAULT false,
    updated_at        timestamptz NOT NULL DEFAULT now()
);

-- The transactional outbox, also the scheduler (rows with a future available_at).
-- partition: 64 fixed lease slots derived from user_id; one relay at a time publishes a slot,
-- so one user's rows are never interleaved by two relays.
CREATE TABLE telecom.outbox (
    id               bigserial PRIMARY KEY,
    message_id       uuid        NOT NULL UNIQUE,
    route            text        NOT NULL,
    message_type     text        NOT NULL,
    schema_version   integer     NOT NULL,
    user_id          uuid,
    seq              bigint,
    partition        integer     NOT NULL GENERATED ALWAYS AS
                         ((hashtextextended(coalesce(user_id::text, ''), 0) & 63)::integer) STORED,
    body             bytea       NOT NULL,
    headers          jsonb       NOT NULL DEFAULT '{}'::jsonb,
    priority         smallint    NOT NULL DEFAULT 0,
    available_at     timestamptz NOT NULL DEFAULT now(),
    created_at       timestamptz NOT NULL DEFAULT now(),
    published_at     timestamptz,
    publish_attempts integer     NOT NULL DEFAULT 0,
    last_error       text,
    cancel_key       text
);
CREATE INDEX outbox_pending ON telecom.outbox (partition, available_at, id) WHERE published_at IS NULL;
CREATE INDEX outbox_cancel_key ON telecom.outbox (cancel_key) WHERE cancel_key IS NOT NULL;

CREATE FUNCTION telecom.outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('pkgq_outbox', '');
    RETURN NULL;
END;
$$;
CREATE TRIGGER outbox_notify AFTER INSERT ON telecom.outbox
    FOR EACH STATEMENT EXECUTE FUNCTION telecom.outbox_notify();

-- The inbox: (consumer, message_id) of every message a consumer has applied.
CREATE TABLE telecom.inbox (
    consumer     text        NOT NULL,
    message_id   uuid        NOT NULL,
    processed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, message_id)
);

-- Access read model for node management, kept by the package_activate and all_expired consumers.
-- seq is the per-user sequence of the last event applied: older events arriving late are ignored.
CREATE TABLE telecom.access (
    user_id    uuid PRIMARY KEY,
    granted    boolean     NOT NULL,
    item_id    bigint,
    package_id bigint,
    remaining  bigint,
    expire_at  timestamptz,
    seq        bigint      NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now()
);
