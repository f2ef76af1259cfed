-- pkgq 0018: trends. Expand only: one new table, nothing changed or dropped.

-- One snapshot per route and minute of the figures the overview's charts draw, taken by the
-- relays' housekeeping at the start of each minute (infra/postgres/trends.py `snapshot`: one
-- statement a minute, the first relay's wins), never by a consumer's batch. The counters are
-- running totals (transition_counts summed over its slots), so a minute's count is the next
-- snapshot's total less this one's, and a missed snapshot loses nothing; the gauges are what
-- was there at that moment. Retention prunes it (trends.RETENTION), keeping a day at least.
CREATE TABLE telecom.route_minutes (
    minute         timestamptz      NOT NULL,
    route          text             NOT NULL,
    taken_at       timestamptz      NOT NULL DEFAULT now(),
    acked          bigint           NOT NULL,
    failed         bigint           NOT NULL,
    dead_lettered  bigint           NOT NULL,
    parked         integer          NOT NULL,
    outbox_pending integer          NOT NULL,
    outbox_lag_s   double precision NOT NULL,
    PRIMARY KEY (minute, route)
);
COMMENT ON COLUMN telecom.route_minutes.acked IS
    'Running total of the route''s ack transitions (processed) when the snapshot was taken';
COMMENT ON COLUMN telecom.route_minutes.failed IS
    'Running total of release (a retry scheduled), ttr and bury: deliveries that failed';
COMMENT ON COLUMN telecom.route_minutes.dead_lettered IS
    'Running total of bury and ttl: messages that entered the dead-letter store';
COMMENT ON COLUMN telecom.route_minutes.parked IS
    'Parked messages of the route''s consumer, counted up to 1,000';
COMMENT ON COLUMN telecom.route_minutes.outbox_pending IS
    'Unpublished outbox rows of the route that were due, counted up to 1,000';
COMMENT ON COLUMN telecom.route_minutes.outbox_lag_s IS
    'Age in seconds of the route''s oldest due unpublished outbox row (0: none)';
