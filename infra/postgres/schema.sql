-- pkgq's schema, as every migration in infra/postgres/migrations yields it, applied in
-- order. Written by `make schema` (deploy/local/dump-schema.sh); checked by
-- tests/integration/test_migrations.py. Not applied by `pkgq migrate`: the migrations are.

CREATE SCHEMA telecom;

CREATE TYPE telecom.dead_letter_status AS ENUM (
    'buried',
    'replayed',
    'discarded',
    'superseded'
);

CREATE TYPE telecom.package_status AS ENUM (
    'in_queue',
    'active',
    'consumed',
    'cancelled'
);

CREATE FUNCTION telecom.message_key(message_id uuid, publisher text, user_id uuid) RETURNS uuid
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    RETURN (md5(((((replace((message_id)::text, '-'::text, ''::text) || '|'::text) || COALESCE(publisher, 'unverified'::text)) || '|'::text) || COALESCE(replace((user_id)::text, '-'::text, ''::text), ''::text))))::uuid;

CREATE TABLE telecom.dead_letters (
    id bigint NOT NULL,
    dedup_key text NOT NULL,
    source text NOT NULL,
    route text NOT NULL,
    consumer text NOT NULL,
    message_id text,
    user_id uuid,
    message_type text,
    content_type text,
    body bytea NOT NULL,
    headers jsonb DEFAULT '{}'::jsonb NOT NULL,
    reason text NOT NULL,
    error_type text NOT NULL,
    error_message text NOT NULL,
    error_location text DEFAULT ''::text NOT NULL,
    traceback text,
    group_key text GENERATED ALWAYS AS ("left"(md5(((((reason || '|'::text) || error_type) || '|'::text) || error_location)), 10)) STORED NOT NULL,
    attempts integer DEFAULT 1 NOT NULL,
    first_failed_at timestamp with time zone DEFAULT now() NOT NULL,
    last_failed_at timestamp with time zone DEFAULT now() NOT NULL,
    status telecom.dead_letter_status DEFAULT 'buried'::telecom.dead_letter_status NOT NULL,
    replay_count integer DEFAULT 0 NOT NULL,
    replayed_at timestamp with time zone,
    replayed_by text,
    discarded_at timestamp with time zone,
    discarded_by text,
    body_size bigint,
    body_sha256 text,
    repeats integer DEFAULT 0 NOT NULL,
    message_uuid uuid,
    publisher text,
    superseded_at timestamp with time zone,
    message_key uuid,
    CONSTRAINT dead_letters_source_check CHECK ((source = ANY (ARRAY['consumer'::text, 'broker'::text, 'relay'::text])))
);

CREATE TABLE telecom.outbox (
    id bigint NOT NULL,
    message_id uuid NOT NULL,
    route text NOT NULL,
    message_type text NOT NULL,
    schema_version integer NOT NULL,
    user_id uuid,
    seq bigint,
    partition integer GENERATED ALWAYS AS (((hashtextextended(COALESCE((user_id)::text, ''::text), (0)::bigint) & (63)::bigint))::integer) STORED NOT NULL,
    body bytea NOT NULL,
    headers jsonb DEFAULT '{}'::jsonb NOT NULL,
    priority smallint DEFAULT 0 NOT NULL,
    available_at timestamp with time zone DEFAULT now() NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    published_at timestamp with time zone,
    publish_attempts integer DEFAULT 0 NOT NULL,
    last_error text,
    cancel_key text,
    dedup_key text,
    expires_at timestamp with time zone,
    CONSTRAINT outbox_priority_range CHECK (((priority >= 0) AND (priority <= 2)))
);

CREATE FUNCTION telecom.blocker_key(p_consumer text, p_user_id uuid, p_blocker uuid, p_key uuid, p_key_of uuid) RETURNS uuid
    LANGUAGE sql STABLE PARALLEL SAFE
    RETURN CASE WHEN (p_blocker IS NULL) THEN NULL::uuid WHEN (p_key_of = p_blocker) THEN p_key ELSE telecom.message_key(p_blocker, COALESCE((SELECT (o.headers ->> 'x-pkgq-publisher'::text) FROM telecom.outbox o WHERE ((o.message_id = blocker_key.p_blocker) AND (o.user_id = blocker_key.p_user_id) AND (o.route = ('telecom.'::text || blocker_key.p_consumer)) AND (o.cancel_key ~~ 'retry:%'::text)) ORDER BY o.id DESC LIMIT 1), (SELECT d.publisher FROM telecom.dead_letters d WHERE ((d.consumer = blocker_key.p_consumer) AND (d.user_id = blocker_key.p_user_id) AND (d.message_uuid = blocker_key.p_blocker)) ORDER BY d.id DESC LIMIT 1)), p_user_id) END;

CREATE FUNCTION telecom.count_burials() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
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

CREATE FUNCTION telecom.count_buried_dead_letters() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    -- The rows that entered `buried` (+1) and left it (-1), by route and kind; a row that
    -- stayed buried under the same route and kind nets to nothing and writes nothing.
    IF TG_OP = 'INSERT' THEN
        INSERT INTO telecom.dead_letter_counts AS c (route, kind, slot, buried)
        SELECT route, CASE WHEN reason = 'expired' THEN 'expired' ELSE 'dead_letters' END,
               (txid_current() % 8)::smallint, count(*)
        FROM new_rows WHERE status = 'buried' GROUP BY 1, 2 ORDER BY 1, 2
        ON CONFLICT (route, kind, slot) DO UPDATE SET buried = c.buried + excluded.buried;
    ELSIF TG_OP = 'UPDATE' THEN
        INSERT INTO telecom.dead_letter_counts AS c (route, kind, slot, buried)
        SELECT route, kind, (txid_current() % 8)::smallint, sum(n)
        FROM (
            SELECT route, CASE WHEN reason = 'expired' THEN 'expired' ELSE 'dead_letters' END
                       AS kind, 1 AS n
            FROM new_rows WHERE status = 'buried'
            UNION ALL
            SELECT route, CASE WHEN reason = 'expired' THEN 'expired' ELSE 'dead_letters' END,
                   -1
            FROM old_rows WHERE status = 'buried'
        ) moved
        GROUP BY 1, 2 HAVING sum(n) <> 0 ORDER BY 1, 2
        ON CONFLICT (route, kind, slot) DO UPDATE SET buried = c.buried + excluded.buried;
    ELSE
        INSERT INTO telecom.dead_letter_counts AS c (route, kind, slot, buried)
        SELECT route, CASE WHEN reason = 'expired' THEN 'expired' ELSE 'dead_letters' END,
               (txid_current() % 8)::smallint, -count(*)
        FROM old_rows WHERE status = 'buried' GROUP BY 1, 2 ORDER BY 1, 2
        ON CONFLICT (route, kind, slot) DO UPDATE SET buried = c.buried + excluded.buried;
    END IF;
    RETURN NULL;
END;
$$;

CREATE FUNCTION telecom.count_puts() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    INSERT INTO telecom.transition_counts AS c (route, transition, slot, count)
    SELECT route, 'put', pg_backend_pid() % 8, count(*) FROM new_rows
    WHERE dedup_key IS NULL GROUP BY route
    ON CONFLICT (route, transition, slot) DO UPDATE SET count = c.count + excluded.count;
    RETURN NULL;
END;
$$;

CREATE FUNCTION telecom.forget_buried_dead_letters() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    DELETE FROM telecom.dead_letter_counts;
    RETURN NULL;
END;
$$;

CREATE FUNCTION telecom.grant_runtime(runtime name) RETURNS void
    LANGUAGE plpgsql
    AS $$
BEGIN
    EXECUTE format('GRANT USAGE ON SCHEMA telecom TO %I', runtime);
    EXECUTE format(
        'GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA telecom TO %I', runtime);
    -- The migration history is the owner's: the runtime may read it, never rewrite it.
    EXECUTE format(
        'REVOKE INSERT, UPDATE, DELETE ON telecom.schema_migrations FROM %I', runtime);
    EXECUTE format('GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA telecom TO %I', runtime);
    EXECUTE format('ALTER DEFAULT PRIVILEGES IN SCHEMA telecom '
                   'GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO %I', runtime);
    EXECUTE format('ALTER DEFAULT PRIVILEGES IN SCHEMA telecom '
                   'GRANT USAGE, SELECT ON SEQUENCES TO %I', runtime);
END
$$;

CREATE FUNCTION telecom.outbox_notify() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    PERFORM pg_notify('pkgq_outbox', '');
    RETURN NULL;
END;
$$;

CREATE FUNCTION telecom.package_queue_default_terms() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    IF NEW.package_name IS NULL THEN
        SELECT p.name, p.traffic_limit, p.duration
        INTO NEW.package_name, NEW.traffic_limit, NEW.duration
        FROM telecom.packages p WHERE p.id = NEW.package_id;
    END IF;
    RETURN NEW;
END;
$$;

CREATE TABLE telecom.access (
    user_id uuid NOT NULL,
    granted boolean NOT NULL,
    item_id bigint,
    package_id bigint,
    remaining bigint,
    expire_at timestamp with time zone,
    seq bigint NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL
)
WITH (fillfactor='80');

CREATE TABLE telecom.addresses (
    address text NOT NULL,
    route text NOT NULL,
    message_id uuid NOT NULL,
    state text NOT NULL,
    error text,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    finished_at timestamp with time zone,
    CONSTRAINT addresses_state_check CHECK ((state = ANY (ARRAY['queued'::text, 'done'::text, 'failed'::text])))
);

CREATE TABLE telecom.attempts (
    consumer text NOT NULL,
    message_id uuid NOT NULL,
    generation integer DEFAULT 0 NOT NULL,
    attempts integer NOT NULL,
    last_claim integer NOT NULL,
    last_at timestamp with time zone DEFAULT now() NOT NULL,
    sent_as uuid
);

CREATE TABLE telecom.consumer_pauses (
    route text NOT NULL,
    paused_at timestamp with time zone DEFAULT now() NOT NULL,
    paused_by text NOT NULL,
    reason text,
    automatic boolean DEFAULT false NOT NULL
);

CREATE TABLE telecom.critical_minutes (
    route text NOT NULL,
    minute smallint NOT NULL,
    bucket smallint NOT NULL,
    slot smallint NOT NULL,
    at timestamp with time zone NOT NULL,
    count bigint NOT NULL,
    CONSTRAINT critical_minutes_bucket_check CHECK ((bucket >= 0)),
    CONSTRAINT critical_minutes_minute_check CHECK (((minute >= 0) AND (minute <= 59)))
);

COMMENT ON COLUMN telecom.critical_minutes.at IS 'The minute the row counts (its start); a row older than an hour is overwritten';

CREATE TABLE telecom.dead_letter_counts (
    route text NOT NULL,
    kind text NOT NULL,
    slot smallint NOT NULL,
    buried bigint DEFAULT 0 NOT NULL,
    CONSTRAINT dead_letter_counts_kind_check CHECK ((kind = ANY (ARRAY['dead_letters'::text, 'expired'::text])))
);

CREATE SEQUENCE telecom.dead_letters_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;

ALTER SEQUENCE telecom.dead_letters_id_seq OWNED BY telecom.dead_letters.id;

CREATE TABLE telecom.group_members (
    message_id uuid NOT NULL,
    group_id uuid NOT NULL,
    route text NOT NULL,
    state text NOT NULL,
    finished_at timestamp with time zone,
    CONSTRAINT group_members_state_check CHECK ((state = ANY (ARRAY['pending'::text, 'done'::text, 'failed'::text, 'cancelled'::text])))
);

CREATE TABLE telecom.holds (
    consumer text NOT NULL,
    user_id uuid NOT NULL,
    blocker uuid,
    state text NOT NULL,
    attempts integer DEFAULT 0 NOT NULL,
    last_error text,
    since timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    blocker_key uuid,
    blocker_key_of uuid,
    CONSTRAINT holds_state_check CHECK ((state = ANY (ARRAY['retrying'::text, 'buried'::text, 'releasing'::text])))
);

CREATE TABLE telecom.inbox (
    consumer text NOT NULL,
    message_id uuid NOT NULL,
    processed_at timestamp with time zone DEFAULT now() NOT NULL,
    user_id uuid,
    sent_as uuid
);

CREATE TABLE telecom.invariant_checks (
    check_name text NOT NULL,
    violations bigint NOT NULL,
    sample jsonb DEFAULT '[]'::jsonb NOT NULL,
    checked_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT invariant_checks_violations_check CHECK ((violations >= 0))
);

CREATE TABLE telecom.item_audit (
    id bigint NOT NULL,
    item_id bigint NOT NULL,
    user_id uuid NOT NULL,
    action text NOT NULL,
    delta bigint,
    reason text,
    operator text,
    message_id uuid NOT NULL,
    at timestamp with time zone DEFAULT now() NOT NULL,
    publisher text,
    CONSTRAINT item_audit_action_check CHECK ((action = ANY (ARRAY['cancel'::text, 'adjust_quota'::text])))
);

CREATE SEQUENCE telecom.item_audit_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;

ALTER SEQUENCE telecom.item_audit_id_seq OWNED BY telecom.item_audit.id;

CREATE TABLE telecom.job_groups (
    id uuid NOT NULL,
    name text NOT NULL,
    state text NOT NULL,
    total integer NOT NULL,
    done integer DEFAULT 0 NOT NULL,
    failed integer DEFAULT 0 NOT NULL,
    cancelled integer DEFAULT 0 NOT NULL,
    on_complete jsonb,
    on_abort jsonb,
    end_message_id uuid,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    finished_at timestamp with time zone,
    cancelled_by text,
    CONSTRAINT job_groups_state_check CHECK ((state = ANY (ARRAY['open'::text, 'completed'::text, 'cancelled'::text]))),
    CONSTRAINT job_groups_total_check CHECK ((total >= 0))
);

CREATE TABLE telecom.leases (
    name text NOT NULL,
    worker_id uuid NOT NULL,
    expires_at timestamp with time zone NOT NULL
);

CREATE TABLE telecom.operator_actions (
    id bigint NOT NULL,
    at timestamp with time zone DEFAULT now() NOT NULL,
    actor text NOT NULL,
    action text NOT NULL,
    user_id uuid,
    item_id bigint,
    dead_letter_id bigint,
    message_id uuid,
    detail jsonb DEFAULT '{}'::jsonb NOT NULL,
    CONSTRAINT operator_actions_action_check CHECK ((action = ANY (ARRAY['cancel'::text, 'adjust_quota'::text, 'edit_replay'::text, 'replay'::text, 'discard'::text, 'release_hold'::text, 'pause_route'::text, 'resume_route'::text])))
);

CREATE SEQUENCE telecom.operator_actions_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;

ALTER SEQUENCE telecom.operator_actions_id_seq OWNED BY telecom.operator_actions.id;

CREATE TABLE telecom.orders (
    user_id uuid NOT NULL,
    by_order uuid NOT NULL,
    item_ids bigint[] NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL
);

CREATE SEQUENCE telecom.outbox_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;

ALTER SEQUENCE telecom.outbox_id_seq OWNED BY telecom.outbox.id;

CREATE TABLE telecom.package_queue (
    id bigint NOT NULL,
    user_id uuid NOT NULL,
    package_id bigint NOT NULL,
    by_order uuid,
    status telecom.package_status DEFAULT 'in_queue'::telecom.package_status NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    activated_at timestamp with time zone,
    upload bigint DEFAULT 0 NOT NULL,
    download bigint DEFAULT 0 NOT NULL,
    adjust_quota bigint DEFAULT 0 NOT NULL,
    expire_at timestamp with time zone,
    package_name text NOT NULL,
    traffic_limit bigint,
    duration interval,
    CONSTRAINT package_queue_download_check CHECK ((download >= 0)),
    CONSTRAINT package_queue_duration_check CHECK ((duration >= '00:00:00'::interval)),
    CONSTRAINT package_queue_some_limit CHECK (((traffic_limit IS NOT NULL) OR (duration IS NOT NULL))),
    CONSTRAINT package_queue_traffic_limit_check CHECK ((traffic_limit >= 0)),
    CONSTRAINT package_queue_upload_check CHECK ((upload >= 0))
)
WITH (fillfactor='80');

CREATE SEQUENCE telecom.package_queue_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;

ALTER SEQUENCE telecom.package_queue_id_seq OWNED BY telecom.package_queue.id;

CREATE TABLE telecom.packages (
    id bigint NOT NULL,
    name text NOT NULL,
    traffic_limit bigint,
    duration interval,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    retired_at timestamp with time zone,
    CONSTRAINT packages_duration_check CHECK ((duration >= '00:00:00'::interval)),
    CONSTRAINT packages_some_limit CHECK (((traffic_limit IS NOT NULL) OR (duration IS NOT NULL))),
    CONSTRAINT packages_traffic_limit_check CHECK ((traffic_limit >= 0))
);

CREATE SEQUENCE telecom.packages_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;

ALTER SEQUENCE telecom.packages_id_seq OWNED BY telecom.packages.id;

CREATE TABLE telecom.parked (
    id bigint NOT NULL,
    consumer text NOT NULL,
    user_id uuid NOT NULL,
    message_id uuid NOT NULL,
    route text NOT NULL,
    message_type text NOT NULL,
    body bytea NOT NULL,
    headers jsonb DEFAULT '{}'::jsonb NOT NULL,
    parked_at timestamp with time zone DEFAULT now() NOT NULL,
    sent_as uuid
);

CREATE SEQUENCE telecom.parked_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;

ALTER SEQUENCE telecom.parked_id_seq OWNED BY telecom.parked.id;

CREATE TABLE telecom.partition_owners (
    route text NOT NULL,
    partition integer NOT NULL,
    worker_id uuid NOT NULL,
    since timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT partition_owners_partition_check CHECK ((partition >= 0))
);

CREATE TABLE telecom.queue_users (
    user_id uuid NOT NULL,
    seq bigint DEFAULT 0 NOT NULL,
    unbilled_upload bigint DEFAULT 0 NOT NULL,
    unbilled_download bigint DEFAULT 0 NOT NULL,
    has_access boolean DEFAULT false NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT queue_users_unbilled_download_check CHECK ((unbilled_download >= 0)),
    CONSTRAINT queue_users_unbilled_upload_check CHECK ((unbilled_upload >= 0))
)
WITH (fillfactor='80');

CREATE TABLE telecom.replay_run_letters (
    run_id bigint NOT NULL,
    "position" integer NOT NULL,
    dead_letter_id bigint NOT NULL,
    state text DEFAULT 'pending'::text NOT NULL,
    leg integer,
    sent_at timestamp with time zone,
    detail text,
    CONSTRAINT replay_run_letters_state_check CHECK ((state = ANY (ARRAY['pending'::text, 'sent'::text, 'skipped'::text])))
);

CREATE TABLE telecom.replay_runs (
    id bigint NOT NULL,
    started_at timestamp with time zone DEFAULT now() NOT NULL,
    started_by text NOT NULL,
    description text DEFAULT ''::text NOT NULL,
    transition text DEFAULT 'dig'::text NOT NULL,
    routes text[] DEFAULT '{}'::text[] NOT NULL,
    rate double precision,
    check_first integer NOT NULL,
    max_failed double precision NOT NULL,
    min_decided integer NOT NULL,
    state text DEFAULT 'running'::text NOT NULL,
    reason text,
    total integer NOT NULL,
    sent integer DEFAULT 0 NOT NULL,
    skipped integer DEFAULT 0 NOT NULL,
    failed_again integer DEFAULT 0 NOT NULL,
    applied integer DEFAULT 0 NOT NULL,
    leg integer DEFAULT 1 NOT NULL,
    leg_started_at timestamp with time zone DEFAULT now() NOT NULL,
    leg_sent integer DEFAULT 0 NOT NULL,
    heartbeat_at timestamp with time zone DEFAULT now() NOT NULL,
    finished_at timestamp with time zone,
    CONSTRAINT replay_runs_check_first_check CHECK ((check_first > 0)),
    CONSTRAINT replay_runs_max_failed_check CHECK (((max_failed >= (0)::double precision) AND (max_failed <= (1)::double precision))),
    CONSTRAINT replay_runs_min_decided_check CHECK ((min_decided > 0)),
    CONSTRAINT replay_runs_rate_check CHECK (((rate IS NULL) OR (rate > (0)::double precision))),
    CONSTRAINT replay_runs_state_check CHECK ((state = ANY (ARRAY['running'::text, 'stopped_failing'::text, 'stopped_breaker'::text, 'done'::text, 'cancelled'::text])))
);

ALTER TABLE telecom.replay_runs ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME telecom.replay_runs_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

CREATE TABLE telecom.route_minutes (
    minute timestamp with time zone NOT NULL,
    route text NOT NULL,
    taken_at timestamp with time zone DEFAULT now() NOT NULL,
    acked bigint NOT NULL,
    failed bigint NOT NULL,
    dead_lettered bigint NOT NULL,
    parked integer NOT NULL,
    outbox_pending integer NOT NULL,
    outbox_lag_s double precision NOT NULL
);

COMMENT ON COLUMN telecom.route_minutes.acked IS 'Running total of the route''s ack transitions (processed) when the snapshot was taken';

COMMENT ON COLUMN telecom.route_minutes.failed IS 'Running total of release (a retry scheduled), ttr and bury: deliveries that failed';

COMMENT ON COLUMN telecom.route_minutes.dead_lettered IS 'Running total of bury and ttl: messages that entered the dead-letter store';

COMMENT ON COLUMN telecom.route_minutes.parked IS 'Parked messages of the route''s consumer, counted up to 1,000';

COMMENT ON COLUMN telecom.route_minutes.outbox_pending IS 'Unpublished outbox rows of the route that were due, counted up to 1,000';

COMMENT ON COLUMN telecom.route_minutes.outbox_lag_s IS 'Age in seconds of the route''s oldest due unpublished outbox row (0: none)';

CREATE TABLE telecom.route_partitions (
    route text NOT NULL,
    partitions integer NOT NULL,
    recorded_at timestamp with time zone DEFAULT now() NOT NULL,
    recorded_by text NOT NULL,
    CONSTRAINT route_partitions_partitions_check CHECK (((partitions >= 1) AND (partitions <= 256)))
);

CREATE TABLE telecom.route_pauses (
    route text NOT NULL,
    paused_at timestamp with time zone DEFAULT now() NOT NULL,
    paused_by text NOT NULL
);

CREATE TABLE telecom.route_replicas (
    route text NOT NULL,
    worker_id uuid NOT NULL,
    joined_at timestamp with time zone DEFAULT now() NOT NULL
);

CREATE TABLE telecom.schema_migrations (
    version integer NOT NULL,
    name text NOT NULL,
    applied_at timestamp with time zone DEFAULT now() NOT NULL
);

CREATE TABLE telecom.transition_counts (
    route text NOT NULL,
    transition text NOT NULL,
    slot smallint NOT NULL,
    count bigint DEFAULT 0 NOT NULL,
    CONSTRAINT transition_counts_transition_check CHECK ((transition = ANY (ARRAY['put'::text, 'take'::text, 'ack'::text, 'release'::text, 'bury'::text, 'dig'::text, 'plow'::text, 'ttl'::text, 'ttr'::text, 'delete'::text])))
);

CREATE TABLE telecom.transition_seconds (
    transition text NOT NULL,
    route text NOT NULL,
    second smallint NOT NULL,
    slot smallint NOT NULL,
    at bigint NOT NULL,
    count bigint NOT NULL,
    CONSTRAINT transition_seconds_second_check CHECK (((second >= 0) AND (second <= 59)))
);

CREATE TABLE telecom.transition_time_repairs (
    item_id bigint NOT NULL,
    user_id uuid NOT NULL,
    status telecom.package_status NOT NULL,
    activated_at_was timestamp with time zone NOT NULL,
    activated_at timestamp with time zone NOT NULL,
    expire_at_was timestamp with time zone,
    expire_at timestamp with time zone,
    repaired_at timestamp with time zone DEFAULT now() NOT NULL
);

COMMENT ON TABLE telecom.transition_time_repairs IS 'Items whose activated_at (and expire_at) migration 0021 moved up, with the old times.';

CREATE TABLE telecom.ttr_strikes (
    consumer text NOT NULL,
    message_id uuid NOT NULL,
    strikes integer DEFAULT 1 NOT NULL,
    last_at timestamp with time zone DEFAULT now() NOT NULL,
    sent_as uuid
);

CREATE TABLE telecom.unique_keys (
    unique_key text NOT NULL,
    message_id uuid NOT NULL,
    expires_at timestamp with time zone NOT NULL
);

CREATE TABLE telecom.usage_billed (
    user_id uuid NOT NULL,
    usage_id text NOT NULL,
    message_id uuid NOT NULL,
    item_id bigint,
    upload bigint NOT NULL,
    download bigint NOT NULL,
    recorded_at timestamp with time zone,
    billed_at timestamp with time zone DEFAULT now() NOT NULL,
    keep_until timestamp with time zone NOT NULL,
    CONSTRAINT usage_billed_download_check CHECK ((download >= 0)),
    CONSTRAINT usage_billed_upload_check CHECK ((upload >= 0)),
    CONSTRAINT usage_billed_usage_id_check CHECK (((length(usage_id) >= 1) AND (length(usage_id) <= 128)))
);

COMMENT ON COLUMN telecom.usage_billed.item_id IS 'The item the traffic was billed to; NULL: kept as the user''s unbilled usage';

COMMENT ON COLUMN telecom.usage_billed.recorded_at IS 'When the traffic happened, as the billing system says (RecordUsage.recorded_at)';

CREATE TABLE telecom.web_sessions (
    id_hash bytea NOT NULL,
    user_name text NOT NULL,
    role text NOT NULL,
    credential bytea NOT NULL,
    signed_in_at timestamp with time zone DEFAULT now() NOT NULL,
    expires_at timestamp with time zone NOT NULL
);

CREATE TABLE telecom.workers (
    id uuid NOT NULL,
    name text NOT NULL,
    role text NOT NULL,
    host text NOT NULL,
    pid integer NOT NULL,
    routes text[] DEFAULT '{}'::text[] NOT NULL,
    started_at timestamp with time zone DEFAULT now() NOT NULL,
    heartbeat_at timestamp with time zone DEFAULT now() NOT NULL,
    stopped_at timestamp with time zone,
    stop_reason text
);

ALTER TABLE ONLY telecom.dead_letters ALTER COLUMN id SET DEFAULT nextval('telecom.dead_letters_id_seq'::regclass);

ALTER TABLE ONLY telecom.item_audit ALTER COLUMN id SET DEFAULT nextval('telecom.item_audit_id_seq'::regclass);

ALTER TABLE ONLY telecom.operator_actions ALTER COLUMN id SET DEFAULT nextval('telecom.operator_actions_id_seq'::regclass);

ALTER TABLE ONLY telecom.outbox ALTER COLUMN id SET DEFAULT nextval('telecom.outbox_id_seq'::regclass);

ALTER TABLE ONLY telecom.package_queue ALTER COLUMN id SET DEFAULT nextval('telecom.package_queue_id_seq'::regclass);

ALTER TABLE ONLY telecom.packages ALTER COLUMN id SET DEFAULT nextval('telecom.packages_id_seq'::regclass);

ALTER TABLE ONLY telecom.parked ALTER COLUMN id SET DEFAULT nextval('telecom.parked_id_seq'::regclass);

ALTER TABLE ONLY telecom.access
    ADD CONSTRAINT access_pkey PRIMARY KEY (user_id);

ALTER TABLE ONLY telecom.addresses
    ADD CONSTRAINT addresses_pkey PRIMARY KEY (address);

ALTER TABLE ONLY telecom.attempts
    ADD CONSTRAINT attempts_pkey PRIMARY KEY (consumer, message_id, generation);

ALTER TABLE ONLY telecom.consumer_pauses
    ADD CONSTRAINT consumer_pauses_pkey PRIMARY KEY (route);

ALTER TABLE ONLY telecom.critical_minutes
    ADD CONSTRAINT critical_minutes_pkey PRIMARY KEY (route, minute, bucket, slot);

ALTER TABLE ONLY telecom.dead_letter_counts
    ADD CONSTRAINT dead_letter_counts_pkey PRIMARY KEY (route, kind, slot);

ALTER TABLE ONLY telecom.dead_letters
    ADD CONSTRAINT dead_letters_dedup_key_key UNIQUE (dedup_key);

ALTER TABLE ONLY telecom.dead_letters
    ADD CONSTRAINT dead_letters_pkey PRIMARY KEY (id);

ALTER TABLE ONLY telecom.group_members
    ADD CONSTRAINT group_members_pkey PRIMARY KEY (message_id);

ALTER TABLE ONLY telecom.holds
    ADD CONSTRAINT holds_pkey PRIMARY KEY (consumer, user_id);

ALTER TABLE ONLY telecom.inbox
    ADD CONSTRAINT inbox_pkey PRIMARY KEY (consumer, message_id);

ALTER TABLE ONLY telecom.invariant_checks
    ADD CONSTRAINT invariant_checks_pkey PRIMARY KEY (check_name);

ALTER TABLE ONLY telecom.item_audit
    ADD CONSTRAINT item_audit_pkey PRIMARY KEY (id);

ALTER TABLE ONLY telecom.job_groups
    ADD CONSTRAINT job_groups_pkey PRIMARY KEY (id);

ALTER TABLE ONLY telecom.leases
    ADD CONSTRAINT leases_pkey PRIMARY KEY (name);

ALTER TABLE ONLY telecom.operator_actions
    ADD CONSTRAINT operator_actions_pkey PRIMARY KEY (id);

ALTER TABLE ONLY telecom.orders
    ADD CONSTRAINT orders_pkey PRIMARY KEY (user_id, by_order);

ALTER TABLE ONLY telecom.outbox
    ADD CONSTRAINT outbox_pkey PRIMARY KEY (id);

ALTER TABLE ONLY telecom.package_queue
    ADD CONSTRAINT package_queue_pkey PRIMARY KEY (id);

ALTER TABLE ONLY telecom.packages
    ADD CONSTRAINT packages_pkey PRIMARY KEY (id);

ALTER TABLE ONLY telecom.parked
    ADD CONSTRAINT parked_consumer_message_id_key UNIQUE (consumer, message_id);

ALTER TABLE ONLY telecom.parked
    ADD CONSTRAINT parked_pkey PRIMARY KEY (id);

ALTER TABLE ONLY telecom.partition_owners
    ADD CONSTRAINT partition_owners_pkey PRIMARY KEY (route, partition);

ALTER TABLE ONLY telecom.queue_users
    ADD CONSTRAINT queue_users_pkey PRIMARY KEY (user_id);

ALTER TABLE ONLY telecom.replay_run_letters
    ADD CONSTRAINT replay_run_letters_pkey PRIMARY KEY (run_id, "position");

ALTER TABLE ONLY telecom.replay_runs
    ADD CONSTRAINT replay_runs_pkey PRIMARY KEY (id);

ALTER TABLE ONLY telecom.route_minutes
    ADD CONSTRAINT route_minutes_pkey PRIMARY KEY (minute, route);

ALTER TABLE ONLY telecom.route_partitions
    ADD CONSTRAINT route_partitions_pkey PRIMARY KEY (route);

ALTER TABLE ONLY telecom.route_pauses
    ADD CONSTRAINT route_pauses_pkey PRIMARY KEY (route);

ALTER TABLE ONLY telecom.route_replicas
    ADD CONSTRAINT route_replicas_pkey PRIMARY KEY (route, worker_id);

ALTER TABLE ONLY telecom.schema_migrations
    ADD CONSTRAINT schema_migrations_pkey PRIMARY KEY (version);

ALTER TABLE ONLY telecom.transition_counts
    ADD CONSTRAINT transition_counts_pkey PRIMARY KEY (route, transition, slot);

ALTER TABLE ONLY telecom.transition_seconds
    ADD CONSTRAINT transition_seconds_pkey PRIMARY KEY (transition, route, second, slot);

ALTER TABLE ONLY telecom.transition_time_repairs
    ADD CONSTRAINT transition_time_repairs_pkey PRIMARY KEY (item_id);

ALTER TABLE ONLY telecom.ttr_strikes
    ADD CONSTRAINT ttr_strikes_pkey PRIMARY KEY (consumer, message_id);

ALTER TABLE ONLY telecom.unique_keys
    ADD CONSTRAINT unique_keys_pkey PRIMARY KEY (unique_key);

ALTER TABLE ONLY telecom.usage_billed
    ADD CONSTRAINT usage_billed_pkey PRIMARY KEY (user_id, usage_id);

ALTER TABLE ONLY telecom.web_sessions
    ADD CONSTRAINT web_sessions_pkey PRIMARY KEY (id_hash);

ALTER TABLE ONLY telecom.workers
    ADD CONSTRAINT workers_pkey PRIMARY KEY (id);

CREATE INDEX addresses_finished ON telecom.addresses USING btree (finished_at) WHERE (finished_at IS NOT NULL);

CREATE INDEX addresses_message ON telecom.addresses USING btree (message_id);

CREATE INDEX attempts_sent_as ON telecom.attempts USING btree (consumer, sent_as) WHERE (sent_as IS NOT NULL);

CREATE INDEX dead_letters_group ON telecom.dead_letters USING btree (group_key);

CREATE INDEX dead_letters_last_failed ON telecom.dead_letters USING btree (last_failed_at);

CREATE INDEX dead_letters_message ON telecom.dead_letters USING btree (message_uuid);

CREATE INDEX dead_letters_message_key ON telecom.dead_letters USING btree (consumer, message_key) WHERE (message_key IS NOT NULL);

CREATE INDEX dead_letters_route ON telecom.dead_letters USING btree (route, first_failed_at);

CREATE INDEX dead_letters_status_failed ON telecom.dead_letters USING btree (status, first_failed_at, id);

CREATE INDEX dead_letters_user ON telecom.dead_letters USING btree (user_id, first_failed_at) WHERE (user_id IS NOT NULL);

CREATE INDEX group_members_group ON telecom.group_members USING btree (group_id, state);

CREATE INDEX holds_blocker ON telecom.holds USING btree (consumer, blocker);

CREATE INDEX holds_held ON telecom.holds USING btree (consumer, state, since) WHERE (blocker IS NOT NULL);

CREATE INDEX holds_releasing ON telecom.holds USING btree (consumer) WHERE (blocker IS NULL);

CREATE INDEX holds_user ON telecom.holds USING btree (user_id, since);

CREATE INDEX inbox_processed_at ON telecom.inbox USING btree (processed_at);

CREATE INDEX inbox_sent_as ON telecom.inbox USING btree (consumer, sent_as) WHERE (sent_as IS NOT NULL);

CREATE INDEX inbox_user ON telecom.inbox USING btree (user_id, processed_at) WHERE (user_id IS NOT NULL);

CREATE INDEX item_audit_item ON telecom.item_audit USING btree (item_id);

CREATE INDEX item_audit_message ON telecom.item_audit USING btree (message_id);

CREATE INDEX item_audit_user ON telecom.item_audit USING btree (user_id, at);

CREATE INDEX job_groups_finished ON telecom.job_groups USING btree (finished_at) WHERE (finished_at IS NOT NULL);

CREATE INDEX operator_actions_at ON telecom.operator_actions USING btree (at);

CREATE UNIQUE INDEX operator_actions_command_once ON telecom.operator_actions USING btree (message_id) WHERE (action = ANY (ARRAY['cancel'::text, 'adjust_quota'::text]));

CREATE INDEX operator_actions_dead_letter ON telecom.operator_actions USING btree (dead_letter_id) WHERE (dead_letter_id IS NOT NULL);

CREATE INDEX operator_actions_message ON telecom.operator_actions USING btree (message_id) WHERE (message_id IS NOT NULL);

CREATE INDEX operator_actions_user ON telecom.operator_actions USING btree (user_id, at) WHERE (user_id IS NOT NULL);

CREATE INDEX outbox_cancel_key ON telecom.outbox USING btree (cancel_key) WHERE (cancel_key IS NOT NULL);

CREATE UNIQUE INDEX outbox_dedup_key ON telecom.outbox USING btree (dedup_key) WHERE (dedup_key IS NOT NULL);

CREATE INDEX outbox_expiring ON telecom.outbox USING btree (partition, expires_at) WHERE ((published_at IS NULL) AND (expires_at IS NOT NULL));

CREATE INDEX outbox_message_id ON telecom.outbox USING btree (message_id);

CREATE INDEX outbox_pending ON telecom.outbox USING btree (partition, available_at, id) WHERE (published_at IS NULL);

CREATE INDEX outbox_unpublished_route ON telecom.outbox USING btree (route, available_at) WHERE (published_at IS NULL);

CREATE INDEX outbox_user ON telecom.outbox USING btree (user_id, created_at, id) WHERE (user_id IS NOT NULL);

CREATE INDEX package_queue_activated ON telecom.package_queue USING btree (activated_at) WHERE (activated_at IS NOT NULL);

CREATE INDEX package_queue_active_expiry ON telecom.package_queue USING btree (expire_at) WHERE ((status = 'active'::telecom.package_status) AND (expire_at IS NOT NULL));

CREATE UNIQUE INDEX package_queue_one_active ON telecom.package_queue USING btree (user_id) WHERE (status = 'active'::telecom.package_status);

CREATE INDEX package_queue_package ON telecom.package_queue USING btree (package_id);

CREATE INDEX package_queue_user_order ON telecom.package_queue USING btree (user_id, created_at, id);

CREATE INDEX package_queue_user_status ON telecom.package_queue USING btree (user_id, status);

CREATE INDEX package_queue_user_status_created ON telecom.package_queue USING btree (user_id, status, created_at);

CREATE INDEX parked_sent_as ON telecom.parked USING btree (consumer, sent_as) WHERE (sent_as IS NOT NULL);

CREATE INDEX parked_user ON telecom.parked USING btree (consumer, user_id, id);

CREATE INDEX parked_user_time ON telecom.parked USING btree (user_id, parked_at);

CREATE INDEX partition_owners_worker_id ON telecom.partition_owners USING btree (worker_id);

CREATE INDEX replay_run_letters_pending ON telecom.replay_run_letters USING btree (run_id, "position") WHERE (state = 'pending'::text);

CREATE INDEX route_replicas_worker_id ON telecom.route_replicas USING btree (worker_id);

CREATE INDEX unique_keys_expires ON telecom.unique_keys USING btree (expires_at);

CREATE INDEX usage_billed_keep_until ON telecom.usage_billed USING btree (keep_until);

CREATE INDEX usage_billed_message ON telecom.usage_billed USING btree (message_id);

CREATE INDEX usage_billed_user ON telecom.usage_billed USING btree (user_id, billed_at);

CREATE INDEX web_sessions_expires_at ON telecom.web_sessions USING btree (expires_at);

CREATE INDEX web_sessions_user_name ON telecom.web_sessions USING btree (user_name);

CREATE INDEX workers_alive ON telecom.workers USING btree (heartbeat_at) WHERE (stopped_at IS NULL);

CREATE TRIGGER dead_letters_count_burials AFTER INSERT OR UPDATE OF status ON telecom.dead_letters FOR EACH ROW EXECUTE FUNCTION telecom.count_burials();

CREATE TRIGGER dead_letters_count_buried_delete AFTER DELETE ON telecom.dead_letters REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION telecom.count_buried_dead_letters();

CREATE TRIGGER dead_letters_count_buried_insert AFTER INSERT ON telecom.dead_letters REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION telecom.count_buried_dead_letters();

CREATE TRIGGER dead_letters_count_buried_truncate AFTER TRUNCATE ON telecom.dead_letters FOR EACH STATEMENT EXECUTE FUNCTION telecom.forget_buried_dead_letters();

CREATE TRIGGER dead_letters_count_buried_update AFTER UPDATE ON telecom.dead_letters REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION telecom.count_buried_dead_letters();

CREATE TRIGGER outbox_count_puts AFTER INSERT ON telecom.outbox REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION telecom.count_puts();

CREATE TRIGGER outbox_notify AFTER INSERT ON telecom.outbox FOR EACH STATEMENT EXECUTE FUNCTION telecom.outbox_notify();

CREATE TRIGGER package_queue_default_terms BEFORE INSERT ON telecom.package_queue FOR EACH ROW EXECUTE FUNCTION telecom.package_queue_default_terms();

ALTER TABLE ONLY telecom.group_members
    ADD CONSTRAINT group_members_group_id_fkey FOREIGN KEY (group_id) REFERENCES telecom.job_groups(id) ON DELETE CASCADE;

ALTER TABLE ONLY telecom.package_queue
    ADD CONSTRAINT package_queue_package_id_fkey FOREIGN KEY (package_id) REFERENCES telecom.packages(id);

ALTER TABLE ONLY telecom.partition_owners
    ADD CONSTRAINT partition_owners_worker_id_fkey FOREIGN KEY (worker_id) REFERENCES telecom.workers(id) ON DELETE CASCADE;

ALTER TABLE ONLY telecom.replay_run_letters
    ADD CONSTRAINT replay_run_letters_run_id_fkey FOREIGN KEY (run_id) REFERENCES telecom.replay_runs(id) ON DELETE CASCADE;

ALTER TABLE ONLY telecom.route_replicas
    ADD CONSTRAINT route_replicas_worker_id_fkey FOREIGN KEY (worker_id) REFERENCES telecom.workers(id) ON DELETE CASCADE;

