-- pkgq 0026: replay runs (`pkgq dlq replay`, `plow`, the console's bulk replay): one row per
-- run, with its pace, the threshold that stops it when its messages fail again, its progress
-- and its state; and the run's frozen set, the dead letters it was started on, in the order it
-- sends them. A run that stopped (its messages failing again, a route's circuit breaker
-- tripped, an operator's cancel) is resumed from its pending letters: what it sent is never
-- sent again, and a letter filed after it started is never taken in.
-- New tables only (expand-only): the previous release never reads them.
CREATE TABLE telecom.replay_runs (
    id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    started_at     timestamptz      NOT NULL DEFAULT now(),
    started_by     text             NOT NULL,
    description    text             NOT NULL DEFAULT '',
    transition     text             NOT NULL DEFAULT 'dig',
    routes         text[]           NOT NULL DEFAULT '{}',
    rate           double precision CHECK (rate IS NULL OR rate > 0),
    check_first    integer          NOT NULL CHECK (check_first > 0),
    max_failed     double precision NOT NULL CHECK (max_failed >= 0 AND max_failed <= 1),
    min_decided    integer          NOT NULL CHECK (min_decided > 0),
    state          text             NOT NULL DEFAULT 'running' CHECK (state IN (
                       'running', 'stopped_failing', 'stopped_breaker', 'done', 'cancelled')),
    reason         text,
    total          integer          NOT NULL,
    sent           integer          NOT NULL DEFAULT 0,
    skipped        integer          NOT NULL DEFAULT 0,
    failed_again   integer          NOT NULL DEFAULT 0,
    applied        integer          NOT NULL DEFAULT 0,
    leg            integer          NOT NULL DEFAULT 1,
    leg_started_at timestamptz      NOT NULL DEFAULT now(),
    leg_sent       integer          NOT NULL DEFAULT 0,
    heartbeat_at   timestamptz      NOT NULL DEFAULT now(),
    finished_at    timestamptz
);

-- No foreign key to dead_letters: `pkgq dlq purge` may delete a replayed letter later.
CREATE TABLE telecom.replay_run_letters (
    run_id         bigint      NOT NULL REFERENCES telecom.replay_runs (id) ON DELETE CASCADE,
    position       integer     NOT NULL,
    dead_letter_id bigint      NOT NULL,
    state          text        NOT NULL DEFAULT 'pending'
                               CHECK (state IN ('pending', 'sent', 'skipped')),
    leg            integer,
    sent_at        timestamptz,
    detail         text,
    PRIMARY KEY (run_id, position)
);

CREATE INDEX replay_run_letters_pending ON telecom.replay_run_letters (run_id, position)
    WHERE state = 'pending';
