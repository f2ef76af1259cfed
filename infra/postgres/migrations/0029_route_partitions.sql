-- pkgq 0029: the deployment's partition map, recorded once (infra/postgres/route_partitions.py).
-- `pkgq migrate` records a row per route that has none: the map its settings configure
-- (PKGQ_PARTITIONS, a routes file) when they configure one, else for a new database the new
-- defaults (16 for telecom.usage_record and telecom.package_purchase, 1 for the others) and
-- for an existing one 1 (what it ran with).
-- It never overwrites a row: `pkgq partitions set` changes one, as docs/how-to/partitions.md
-- describes. Every process that routes or consumes reads the map at start-up.
-- Expand only: a new table; the previous release never reads it.
CREATE TABLE telecom.route_partitions (
    route       text        PRIMARY KEY,
    partitions  integer     NOT NULL CHECK (partitions BETWEEN 1 AND 256),
    recorded_at timestamptz NOT NULL DEFAULT now(),
    recorded_by text        NOT NULL
);
