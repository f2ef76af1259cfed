-- pkgq 0027: elastic replicas of a partitioned route (consumers/rebalance.py). A `pkgq run`
-- that is not pinned to `--replica I/N` joins each partitioned route it consumes
-- (route_replicas), and every such replica reads the route's live members about once a second
-- (live: its worker's heartbeat within the rebalance bound, infra/postgres/partition_owners.py)
-- and consumes the partitions rendezvous hashing gives it (domain/assignment.py).
-- partition_owners records who took which partition since when (`pkgq workers`, the console's
-- workers page). Both go with their worker's row when retention prunes it.
-- Expand only: new tables; the previous release never reads them.
CREATE TABLE telecom.route_replicas (
    route     text        NOT NULL,
    worker_id uuid        NOT NULL REFERENCES telecom.workers (id) ON DELETE CASCADE,
    joined_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (route, worker_id)
);

CREATE TABLE telecom.partition_owners (
    route     text        NOT NULL,
    partition integer     NOT NULL CHECK (partition >= 0),
    worker_id uuid        NOT NULL REFERENCES telecom.workers (id) ON DELETE CASCADE,
    since     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (route, partition)
);

-- A worker's memberships and partitions, found when it leaves (and by the cascades).
CREATE INDEX route_replicas_worker_id ON telecom.route_replicas (worker_id);
CREATE INDEX partition_owners_worker_id ON telecom.partition_owners (worker_id);
