-- pkgq 0004: job-queue semantics: priority, TTL, addressed work, unique windows,
-- groups, workers with heartbeats, leases for singleton jobs, and transition counters.

-- Retention prunes processed-message records by age.
CREATE INDEX inbox_processed_at ON telecom.inbox (processed_at);

-- TTL: a row not published by expires_at is never published; it is recorded as expired.
ALTER TABLE telecom.outbox ADD COLUMN expires_at timestamptz;
CREATE INDEX outbox_expiring ON telecom.outbox (partition, expires_at)
    WHERE published_at IS NULL AND expires_at IS NOT NULL;
-- Claim order is priority first (higher is more urgent), then id (FIFO within a priority).
ALTER TABLE telecom.outbox ADD CONSTRAINT outbox_priority_range CHECK (priority BETWEEN 0 AND 2);

-- The dead-letter store now also holds what the relay expired before publishing it.
ALTER TABLE telecom.dead_letters DROP CONSTRAINT dead_letters_source_check;
ALTER TABLE telecom.dead_letters ADD CONSTRAINT dead_letters_source_check
    CHECK (source IN ('consumer', 'broker', 'relay'));

-- Addressed work: at most one queued-or-in-flight message per address. A finished
-- address (done or failed) may be used again.
CREATE TABLE telecom.addresses (
    address     text PRIMARY KEY,
    route       text        NOT NULL,
    message_id  uuid        NOT NULL,
    state       text        NOT NULL CHECK (state IN ('queued', 'done', 'failed')),
    error       text,
    created_at  timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz
);
CREATE INDEX addresses_message ON telecom.addresses (message_id);
CREATE INDEX addresses_finished ON telecom.addresses (finished_at) WHERE finished_at IS NOT NULL;

-- Unique windows: route + sha256 of the arguments, taken until expires_at.
CREATE TABLE telecom.unique_keys (
    unique_key text PRIMARY KEY,
    message_id uuid        NOT NULL,
    expires_at timestamptz NOT NULL
);
CREATE INDEX unique_keys_expires ON telecom.unique_keys (expires_at);

-- Groups: members, and an end message published once every member has finished,
-- or an abort message once a cancelled group is empty.
CREATE TABLE telecom.job_groups (
    id              uuid PRIMARY KEY,
    name            text        NOT NULL,
    state           text        NOT NULL CHECK (state IN ('open', 'completed', 'cancelled')),
    total           integer     NOT NULL CHECK (total >= 0),
    done            integer     NOT NULL DEFAULT 0,
    failed          integer     NOT NULL DEFAULT 0,
    cancelled       integer     NOT NULL DEFAULT 0,
    on_complete     jsonb,
    on_abort        jsonb,
    end_message_id  uuid,
    created_at      timestamptz NOT NULL DEFAULT now(),
    finished_at     timestamptz,
    cancelled_by    text
);
CREATE INDEX job_groups_finished ON telecom.job_groups (finished_at) WHERE finished_at IS NOT NULL;

CREATE TABLE telecom.group_members (
    message_id  uuid PRIMARY KEY,
    group_id    uuid        NOT NULL REFERENCES telecom.job_groups (id) ON DELETE CASCADE,
    route       text        NOT NULL,
    state       text        NOT NULL CHECK (state IN ('pending', 'done', 'failed', 'cancelled')),
    finished_at timestamptz
);
CREATE INDEX group_members_group ON telecom.group_members (group_id, state);

-- Workers (permits): every long-running process registers and heartbeats. Its
-- Postgres connections carry application_name 'pkgq:<id>', so a stale worker's connections (and
-- with them its advisory leases and open transactions) can be terminated by the others.
CREATE TABLE telecom.workers (
    id           uuid PRIMARY KEY,
    name         text        NOT NULL,
    role         text        NOT NULL,
    host         text        NOT NULL,
    pid          integer     NOT NULL,
    routes       text[]      NOT NULL DEFAULT '{}',
    started_at   timestamptz NOT NULL DEFAULT now(),
    heartbeat_at timestamptz NOT NULL DEFAULT now(),
    stopped_at   timestamptz,
    stop_reason  text
);
CREATE INDEX workers_alive ON telecom.workers (heartbeat_at) WHERE stopped_at IS NULL;

-- Leases of singleton jobs (the expiry sweep, retention pruning): held by one worker until
-- expires_at; a lease whose holder is stale or gone is free.
CREATE TABLE telecom.leases (
    name       text PRIMARY KEY,
    worker_id  uuid        NOT NULL,
    expires_at timestamptz NOT NULL
);

-- TTR strikes: how often a message's handler ran past the route's TTR.
CREATE TABLE telecom.ttr_strikes (
    consumer   text        NOT NULL,
    message_id uuid        NOT NULL,
    strikes    integer     NOT NULL DEFAULT 1,
    last_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, message_id)
);

-- Transition counters (the job-queue stats): per route and transition, spread over 8 slots so that
-- concurrent transactions rarely wait on one counter row. Read with sum(count).
CREATE TABLE telecom.transition_counts (
    route      text     NOT NULL,
    transition text     NOT NULL CHECK (transition IN
        ('put', 'take', 'ack', 'release', 'bury', 'dig', 'plow', 'ttl', 'ttr', 'delete')),
    slot       smallint NOT NULL,
    count      bigint   NOT NULL DEFAULT 0,
    PRIMARY KEY (route, transition, slot)
);

-- put: every new message written to the outbox (retries and replays carry a dedup_key and are
-- counted as release, dig or plow where they are made).
CREATE FUNCTION telecom.count_puts() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO telecom.transition_counts AS c (route, transition, slot, count)
    SELECT route, 'put', pg_backend_pid() % 8, count(*) FROM new_rows
    WHERE dedup_key IS NULL GROUP BY route
    ON CONFLICT (route, transition, slot) DO UPDATE SET count = c.count + excluded.count;
    RETURN NULL;
END;
$$;
CREATE TRIGGER outbox_count_puts AFTER INSERT ON telecom.outbox
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION telecom.count_puts();

-- bury / ttl: a dead letter entering `buried` (an expired message counts as ttl).
CREATE FUNCTION telecom.count_burials() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.status = 'buried' AND (TG_OP = 'INSERT' OR OLD.status <> 'buried') THEN
        INSERT INTO telecom.transition_counts AS c (route, transition, slot, count)
        VALUES (NEW.route, CASE WHEN NEW.reason = 'expired' THEN 'ttl' ELSE 'bury' END,
                pg_backend_pid() % 8, 1)
        ON CONFLICT (route, transition, slot) DO UPDATE SET count = c.count + 1;
    END IF;
    RETURN NULL;
END;
$$;
CREATE TRIGGER dead_letters_count_burials AFTER INSERT OR UPDATE OF status
    ON telecom.dead_letters FOR EACH ROW EXECUTE FUNCTION telecom.count_burials();
