"""The figures every status port refreshes (every PKGQ_METRICS_REFRESH_INTERVAL, in every
process) and the console's overview shows (every 3 s per open page), read without counting a
growing table row by row: no statement here reads the inbox, the outbox's published rows or the
dead-letter store beyond a fixed number of index entries, whatever their size.

Each figure is one of three kinds:

- **counter**, exact: kept in the transaction that makes the change.
  - buried dead letters per route (expired ones apart): telecom.dead_letter_counts, kept by
    triggers on the dead-letter store (migration 0015);
  - done and the other transitions: telecom.transition_counts (transitions.totals);
  - processed in the last minute: the acks of the last 60 one-second buckets of
    telecom.transition_seconds, written by the batch's one counting statement
    (transitions.last_minute).
- **bounded count**, exact up to EXACT_UP_TO: counted in an index, in index order, stopping at
  EXACT_UP_TO entries per figure; at the cap it becomes an estimate (below).
  - outbox rows due (pending) and scheduled per route, and the oldest due row: the index
    outbox_unpublished_route of the unpublished rows (migration 0015);
  - parked messages per consumer: parked's (consumer, message_id) key;
  - users held per consumer and hold state: the index holds_held (migration 0015);
  - dead letters filed or failed again in the last minute: dead_letters_last_failed (migration
    0011), one count over all routes: at the cap every route's figure is a lower bound.
- **estimate**: kept (zombie: processed messages remembered per consumer) is a bounded count of
  the inbox's primary key that is over the cap in any real deployment, and so an estimate.

A figure at the cap is estimated from the statistics autovacuum keeps, as the planner does:
pg_class.reltuples of the index (or table) it was counted in, scaled to the relation's current
size, less the figures under the cap, shared among the figures at the cap (in the inbox's case
in proportion to each consumer's share in pg_stats, evenly otherwise), and never less than the
cap. Each result names the figures that are estimates (`estimated`), and they are shown as such.
`pkgq stats` shows these same figures.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

from infra.postgres import transitions
from infra.postgres.pool import Conn

EXACT_UP_TO = 1_000
"""Index entries a bounded count reads at most, per figure: its figures are exact below it."""

K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True, slots=True)
class Backlog:
    outbox_pending: int
    outbox_oldest_s: float
    buried_by_route: dict[str, int]
    held: dict[tuple[str, str], int]
    """Users held behind a blocker, by (consumer, hold state)."""
    estimated: frozenset[str] = frozenset()
    """Which of `outbox_pending` and `held` hold an estimate (see the module docstring)."""


@dataclass(slots=True)
class RouteFigures:
    """Per route: outbox rows `scheduled` (future) and `pending` (due, unpublished), `parked`
    messages, buried `dead_letters` and `expired` ones, processed-message records `kept` (the
    inbox), and messages `processed_1m` (acked) and dead letters `failed_1m` (filed or failed
    again) in the last minute."""

    counts: dict[str, dict[str, int]] = field(default_factory=dict)
    estimated: dict[str, set[str]] = field(default_factory=dict)
    """route -> which of its figures are estimates."""

    def put(self, route: str, what: str, n: int, estimated: bool = False) -> None:
        self.counts.setdefault(route, {})[what] = n
        if estimated:
            self.estimated.setdefault(route, set()).add(what)

    def of(self, route: str) -> dict[str, int]:
        return self.counts.get(route, {})


_OUTBOX = """
WITH RECURSIVE routes AS (
    (SELECT route FROM telecom.outbox WHERE published_at IS NULL ORDER BY route LIMIT 1)
    UNION ALL
    SELECT n.route FROM routes r, LATERAL (
        SELECT o.route FROM telecom.outbox o
        WHERE o.published_at IS NULL AND o.route > r.route ORDER BY o.route LIMIT 1) n
)
SELECT r.route,
       (SELECT extract(epoch FROM now() - min(o.available_at))::float8 FROM telecom.outbox o
        WHERE o.published_at IS NULL AND o.route = r.route AND o.available_at <= now()) AS lag,
       (SELECT count(*) FROM (
            SELECT FROM telecom.outbox o
            WHERE o.published_at IS NULL AND o.route = r.route AND o.available_at <= now()
            ORDER BY o.available_at LIMIT $1) due) AS pending,
       (SELECT count(*) FROM (
            SELECT FROM telecom.outbox o
            WHERE o.published_at IS NULL AND o.route = r.route AND o.available_at > now()
            ORDER BY o.available_at LIMIT $1) later) AS scheduled
FROM routes r
"""

_INBOX = """
WITH RECURSIVE consumers AS (
    (SELECT consumer FROM telecom.inbox ORDER BY consumer LIMIT 1)
    UNION ALL
    SELECT n.consumer FROM consumers c, LATERAL (
        SELECT i.consumer FROM telecom.inbox i WHERE i.consumer > c.consumer
        ORDER BY i.consumer LIMIT 1) n
)
SELECT c.consumer AS key, (
    SELECT count(*) FROM (
        SELECT FROM telecom.inbox i WHERE i.consumer = c.consumer
        ORDER BY i.message_id LIMIT $1) kept) AS n
FROM consumers c
"""

_PARKED = """
WITH RECURSIVE consumers AS (
    (SELECT consumer FROM telecom.parked ORDER BY consumer LIMIT 1)
    UNION ALL
    SELECT n.consumer FROM consumers c, LATERAL (
        SELECT p.consumer FROM telecom.parked p WHERE p.consumer > c.consumer
        ORDER BY p.consumer LIMIT 1) n
)
SELECT c.consumer AS key, (
    SELECT count(*) FROM (
        SELECT FROM telecom.parked p WHERE p.consumer = c.consumer
        ORDER BY p.message_id LIMIT $1) parked) AS n
FROM consumers c
"""

_HELD = """
WITH RECURSIVE held AS (
    (SELECT consumer, state FROM telecom.holds WHERE blocker IS NOT NULL
     ORDER BY consumer, state LIMIT 1)
    UNION ALL
    SELECT n.consumer, n.state FROM held h, LATERAL (
        SELECT x.consumer, x.state FROM telecom.holds x
        WHERE x.blocker IS NOT NULL AND (x.consumer, x.state) > (h.consumer, h.state)
        ORDER BY x.consumer, x.state LIMIT 1) n
)
SELECT h.consumer, h.state, (
    SELECT count(*) FROM (
        SELECT FROM telecom.holds x
        WHERE x.blocker IS NOT NULL AND x.consumer = h.consumer AND x.state = h.state
        ORDER BY x.since LIMIT $1) users) AS n
FROM held h
"""

_BURIED = """
SELECT route, kind, sum(buried)::bigint AS n FROM telecom.dead_letter_counts
GROUP BY route, kind HAVING sum(buried) <> 0
"""

_FAILED_1M = """
SELECT route, count(*) AS n FROM (
    SELECT route FROM telecom.dead_letters
    WHERE last_failed_at > now() - interval '1 minute'
    ORDER BY last_failed_at LIMIT $1) recent
GROUP BY route
"""

_SIZES = """
SELECT r.name, CASE WHEN c.reltuples < 0 THEN NULL
                    WHEN c.relpages = 0 THEN c.reltuples::float8
                    ELSE c.reltuples::float8 / c.relpages
                         * (pg_relation_size(c.oid) / current_setting('block_size')::float8)
               END AS rows
FROM unnest($1::text[]) AS r(name) JOIN pg_class c ON c.oid = r.name::regclass
"""

_INBOX_SHARES = """
SELECT v.consumer, v.share
FROM pg_stats s, unnest(s.most_common_vals::text::text[], s.most_common_freqs)
    AS v(consumer, share)
WHERE s.schemaname = 'telecom' AND s.tablename = 'inbox' AND s.attname = 'consumer'
"""


def shared(
    counted: Mapping[K, int],
    total: float | None,
    weights: Mapping[K, float] | None = None,
    cap: int = EXACT_UP_TO,
) -> tuple[dict[K, int], set[K]]:
    """Counts that stopped at `cap` become estimates: what `total` (the estimated entries of the
    index they were all counted in) leaves after the counts under the cap, shared among them in
    proportion to `weights` (evenly when a weight is missing), never less than the cap. Returns
    the figures and the keys estimated."""
    figures = dict(counted)
    capped = [k for k, n in counted.items() if n >= cap]
    if not capped:
        return figures, set()
    rest = (total or 0.0) - sum(n for n in counted.values() if n < cap)
    found = {k: (weights or {}).get(k, 0.0) for k in capped}
    if any(w <= 0 for w in found.values()):
        found = dict.fromkeys(capped, 1.0)
    whole = sum(found.values())
    for k in capped:
        figures[k] = max(cap, round(rest * found[k] / whole))
    return figures, set(capped)


async def sizes(conn: Conn, relations: Iterable[str]) -> dict[str, float | None]:
    """Each relation's estimated rows (None: never analyzed), as the planner estimates them."""
    rows = await conn.fetch(_SIZES, list(relations))
    return {r["name"]: r["rows"] for r in rows}


async def _outbox(conn: Conn) -> tuple[dict[tuple[str, str], int], set[tuple[str, str]], float]:
    """(route, pending|scheduled) -> rows, those estimated, and the oldest due row's lag."""
    rows = await conn.fetch(_OUTBOX, EXACT_UP_TO)
    counted = {(r["route"], what): int(r[what]) for r in rows for what in ("pending", "scheduled")}
    lag = max((float(r["lag"]) for r in rows if r["lag"] is not None), default=0.0)
    total = None
    if any(n >= EXACT_UP_TO for n in counted.values()):
        total = (await sizes(conn, ["telecom.outbox_unpublished_route"]))[
            "telecom.outbox_unpublished_route"
        ]
    # Due rows past the cap are shown at the cap, marked (at least that many: a backlog to
    # see at once, not to size); only the scheduled rows (timers, delays) share what the index
    # holds beyond the counts, as estimates. Sharing the whole index among due and scheduled
    # figures alike showed a route with 1,200 due rows as ~100,000 due next to 200,000 timers.
    due = {k: n for k, n in counted.items() if k[1] == "pending"}
    later = {k: n for k, n in counted.items() if k[1] == "scheduled"}
    figures, estimated = shared(later, None if total is None else total - sum(due.values()))
    figures.update(due)
    estimated |= {k for k, n in due.items() if n >= EXACT_UP_TO}
    return figures, estimated, max(lag, 0.0)


async def held(conn: Conn) -> tuple[dict[tuple[str, str], int], bool]:
    """Users held behind a blocker by (consumer, hold state), and whether any is an estimate."""
    rows = await conn.fetch(_HELD, EXACT_UP_TO)
    counted = {(r["consumer"], r["state"]): int(r["n"]) for r in rows}
    total = None
    if any(n >= EXACT_UP_TO for n in counted.values()):
        total = (await sizes(conn, ["telecom.holds_held"]))["telecom.holds_held"]
    figures, estimated = shared(counted, total)
    return figures, bool(estimated)


async def _buried(conn: Conn) -> dict[tuple[str, str], int]:
    """(route, dead_letters|expired) -> buried now (the counters)."""
    rows = await conn.fetch(_BURIED)
    return {(r["route"], r["kind"]): int(r["n"]) for r in rows}


async def backlog(conn: Conn) -> Backlog:
    outbox, outbox_estimated, lag = await _outbox(conn)
    buried: dict[str, int] = {}
    for (route, _), n in (await _buried(conn)).items():
        buried[route] = buried.get(route, 0) + n
    users, held_estimated = await held(conn)
    estimated = {"outbox_pending"} if any(w == "pending" for _, w in outbox_estimated) else set()
    if held_estimated:
        estimated.add("held")
    return Backlog(
        outbox_pending=sum(n for (_, what), n in outbox.items() if what == "pending"),
        outbox_oldest_s=lag,
        buried_by_route=buried,
        held=users,
        estimated=frozenset(estimated),
    )


async def _per_consumer(
    conn: Conn, sql: str, relation: str, weights: bool = False
) -> tuple[dict[str, int], set[str]]:
    """A bounded count per consumer (`sql`), estimated at the cap from `relation`'s size."""
    counted = {r["key"]: int(r["n"]) for r in await conn.fetch(sql, EXACT_UP_TO)}
    if not any(n >= EXACT_UP_TO for n in counted.values()):
        return counted, set()
    total = (await sizes(conn, [relation]))[relation]
    shares = None
    if weights:
        shares = {r["consumer"]: float(r["share"]) for r in await conn.fetch(_INBOX_SHARES)}
    return shared(counted, total, shares)


async def per_route(conn: Conn) -> RouteFigures:
    """Every figure of RouteFigures, per route (see the module docstring for how each is read)."""
    found = RouteFigures()
    outbox, estimated, _ = await _outbox(conn)
    for (route, what), n in outbox.items():
        found.put(route, what, n, (route, what) in estimated)
    parked, parked_estimated = await _per_consumer(conn, _PARKED, "telecom.parked")
    for consumer, n in parked.items():
        found.put(f"telecom.{consumer}", "parked", n, consumer in parked_estimated)
    for (route, kind), n in (await _buried(conn)).items():
        found.put(route, kind, n)
    kept, kept_estimated = await _per_consumer(conn, _INBOX, "telecom.inbox", weights=True)
    for consumer, n in kept.items():
        found.put(f"telecom.{consumer}", "kept", n, consumer in kept_estimated)
    for route, n in (await transitions.last_minute(conn, "ack")).items():
        found.put(route, "processed_1m", n)
    failed = {r["route"]: int(r["n"]) for r in await conn.fetch(_FAILED_1M, EXACT_UP_TO)}
    at_cap = sum(failed.values()) >= EXACT_UP_TO
    for route, n in failed.items():
        found.put(route, "failed_1m", n, at_cap)
    return found
