-- pkgq 0028: critical time on the console. Expand only: one new table, nothing changed or
-- dropped; the previous release never reads it.

-- Per route and minute, how many applied messages' critical time (from their first
-- publication to the batch that applied them: infra/observability.py) fell in each of the
-- fixed buckets (`bucket`: the index of its upper bound in CRITICAL_BOUNDS), written by the
-- batch's counters part (infra/postgres/batch_write.py `count_moves`, no statement of its own)
-- and read for the last hour by the overview (infra/postgres/trends.py `read_critical`).
-- A ring: `minute` is the minute of the hour, and a minute's first write replaces the row an
-- hour older (`at` says which minute a row holds), so it never grows beyond routes x 60
-- minutes x buckets x slots and needs no pruning. `slot` spreads concurrent writers, as in
-- transition_counts.
CREATE TABLE telecom.critical_minutes (
    route  text        NOT NULL,
    minute smallint    NOT NULL CHECK (minute BETWEEN 0 AND 59),
    bucket smallint    NOT NULL CHECK (bucket >= 0),
    slot   smallint    NOT NULL,
    at     timestamptz NOT NULL,
    count  bigint      NOT NULL,
    PRIMARY KEY (route, minute, bucket, slot)
);
COMMENT ON COLUMN telecom.critical_minutes.at IS
    'The minute the row counts (its start); a row older than an hour is overwritten';
