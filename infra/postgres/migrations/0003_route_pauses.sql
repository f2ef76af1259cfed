-- pkgq 0003: routes whose outbox rows the relay holds back (while an operator changes the
-- route's partition count: see the README). Rows stay pending, in order, until resumed.
CREATE TABLE telecom.route_pauses (
    route     text PRIMARY KEY,
    paused_at timestamptz NOT NULL DEFAULT now(),
    paused_by text        NOT NULL
);
