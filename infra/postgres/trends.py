"""Trends: per route and minute, what the overview's charts draw (telecom.route_minutes,
migration 0018).

The relays' housekeeping takes a `snapshot` at the start of every minute: one statement a
minute, whoever runs it first (the others find the minute taken and write nothing), and
nothing on a consumer's path. A snapshot holds running totals (`acked`, `failed`,
`dead_lettered`, summed from telecom.transition_counts) and gauges (`parked`, `outbox_pending`,
`outbox_lag_s`, counted in indexes up to stats.EXACT_UP_TO, as the overview counts them).

`read` answers a window of buckets (a minute each over the last hour, five minutes each over
the last day): a bucket's counts are the differences between consecutive snapshots (the
current minute's against the live totals, so the last bucket moves while you look), summed; its
gauges are the largest seen in it. A bucket without traffic counts 0; a gauge that nobody
snapshotted (no relay ran) is None. A minute whose snapshot was missed (every relay down) gives
its counts to the snapshot before it: nothing is lost, it shows a little early. What was
counted before the first snapshot ever (before this release's first relay started) is charted
nowhere: when it happened is not known.

Which moves are which:
- processed: ack;
- failed: release (a retry scheduled), ttr (taken too long) and bury (buried at once or after
  the last retry): every delivery that failed;
- dead-lettered: bury and ttl (expired): what entered the dead-letter store.
The outbox's lag is the age of the route's oldest due unpublished row (what `pkgq_outbox_oldest_
pending_seconds` alerts on), exact whatever the backlog; its pending count is kept beside it,
but it stops at the cap.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from events.routes import ROUTES
from infra.postgres.pool import Conn
from infra.postgres.pruning import Rule
from infra.postgres.stats import EXACT_UP_TO

CHARTED: tuple[tuple[str, str], ...] = tuple((r.name, r.short_name) for r in ROUTES.values())
"""(route, consumer) of every route pkgq consumes: the routes snapshotted and charted."""

KEEP_AT_LEAST = timedelta(hours=25)
"""The day's chart needs a day of snapshots (and the one before it), whatever the retention."""

RETENTION = Rule(
    "route_minutes",
    "telecom.route_minutes",
    "ctid",
    "minute < least({cutoff}, now() - "
    f"make_interval(secs => {int(KEEP_AT_LEAST.total_seconds())}))",
)
"""Snapshots older than the retention go, but never the last KEEP_AT_LEAST."""

COUNTS = ("processed", "failed", "dead_lettered")
GAUGES = ("parked", "outbox_pending", "outbox_lag_s")


@dataclass(frozen=True, slots=True)
class Window:
    name: str
    step: timedelta
    buckets: int


WINDOWS = {
    "1h": Window("1h", timedelta(minutes=1), 60),
    "1d": Window("1d", timedelta(minutes=5), 288),
}
"""The windows the overview offers: the last hour by the minute, the last day by 5 minutes."""


@dataclass(slots=True)
class RouteTrend:
    processed: list[int] = field(default_factory=list)
    failed: list[int] = field(default_factory=list)
    dead_lettered: list[int] = field(default_factory=list)
    parked: list[int | None] = field(default_factory=list)
    outbox_pending: list[int | None] = field(default_factory=list)
    outbox_lag_s: list[float | None] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Trends:
    window: Window
    buckets: list[datetime]
    """Each bucket's start, oldest first; the last one holds now."""
    routes: dict[str, RouteTrend]
    """route -> one value per bucket in each series."""


# The live figures per route, as a snapshot holds them. $1: the routes, $2: their consumers
# (parked is kept per consumer), $3: the cap of the bounded counts.
_FIGURES = """
routes AS (SELECT * FROM unnest($1::text[], $2::text[]) AS r(route, consumer)),
moves AS (
    SELECT route,
           sum(count) FILTER (WHERE transition = 'ack') AS acked,
           sum(count) FILTER (WHERE transition IN ('release', 'ttr', 'bury')) AS failed,
           sum(count) FILTER (WHERE transition IN ('bury', 'ttl')) AS dead_lettered
    FROM telecom.transition_counts
    WHERE route = ANY($1::text[]) AND transition IN ('ack', 'release', 'ttr', 'bury', 'ttl')
    GROUP BY route
),
figures AS (
    SELECT r.route,
           coalesce(m.acked, 0)::bigint AS acked,
           coalesce(m.failed, 0)::bigint AS failed,
           coalesce(m.dead_lettered, 0)::bigint AS dead_lettered,
           (SELECT count(*) FROM (
                SELECT FROM telecom.parked p WHERE p.consumer = r.consumer
                ORDER BY p.message_id LIMIT $3) parked)::int AS parked,
           (SELECT count(*) FROM (
                SELECT FROM telecom.outbox o
                WHERE o.published_at IS NULL AND o.route = r.route AND o.available_at <= now()
                ORDER BY o.available_at LIMIT $3) due)::int AS outbox_pending,
           coalesce((SELECT extract(epoch FROM now() - min(o.available_at))::float8
                     FROM telecom.outbox o
                     WHERE o.published_at IS NULL AND o.route = r.route
                       AND o.available_at <= now()), 0) AS outbox_lag_s
    FROM routes r LEFT JOIN moves m USING (route)
)
"""

_SNAPSHOT = f"""
WITH {_FIGURES}
INSERT INTO telecom.route_minutes
    (minute, route, acked, failed, dead_lettered, parked, outbox_pending, outbox_lag_s)
SELECT date_trunc('minute', now()), f.route, f.acked, f.failed, f.dead_lettered, f.parked,
       f.outbox_pending, greatest(f.outbox_lag_s, 0)
FROM figures f
WHERE NOT EXISTS (
    SELECT FROM telecom.route_minutes WHERE minute = date_trunc('minute', now()))
ON CONFLICT (minute, route) DO NOTHING
"""

# $4: the bucket width, $5: how many buckets. Buckets are aligned to the epoch, so a 5-minute
# bucket starts at :00, :05, ... whoever asks; `minute >= first` reads the primary key's range
# and nothing before it. The totals only grow (nothing in pkgq lowers them; a hand-made reset
# shows as one bucket's jump), so a bucket's counts are the next bucket's first total less its
# own first (the sum of its minutes' differences, read from one row per bucket
# after grouping, not from every minute); the current bucket's run to the live totals.
_READ = f"""
WITH {_FIGURES},
span AS (
    SELECT date_bin($4::interval, now(), timestamptz 'epoch') AS last,
           date_bin($4::interval, now(), timestamptz 'epoch') - ($5 - 1) * $4::interval AS first
),
snaps AS (
    SELECT s.minute AS at, s.route, s.acked, s.failed, s.dead_lettered, s.parked,
           s.outbox_pending, s.outbox_lag_s
    FROM telecom.route_minutes s, span
    WHERE s.minute >= span.first AND s.route = ANY($1::text[])
    UNION ALL
    SELECT now(), route, acked, failed, dead_lettered, parked, outbox_pending,
           greatest(outbox_lag_s, 0)
    FROM figures
),
grouped AS (
    SELECT route, date_bin($4::interval, at, timestamptz 'epoch') AS bucket,
           min(acked) AS acked, max(acked) AS acked_last,
           min(failed) AS failed, max(failed) AS failed_last,
           min(dead_lettered) AS dead_lettered, max(dead_lettered) AS dead_lettered_last,
           max(parked) AS parked, max(outbox_pending) AS outbox_pending,
           max(outbox_lag_s) AS outbox_lag_s
    FROM snaps GROUP BY 1, 2
),
summed AS (
    SELECT route, bucket,
           greatest(coalesce(lead(acked) OVER w, acked_last) - acked, 0) AS processed,
           greatest(coalesce(lead(failed) OVER w, failed_last) - failed, 0) AS failed,
           greatest(coalesce(lead(dead_lettered) OVER w, dead_lettered_last) - dead_lettered, 0)
               AS dead_lettered,
           parked, outbox_pending, outbox_lag_s
    FROM grouped
    WINDOW w AS (PARTITION BY route ORDER BY bucket)
)
SELECT r.route,
       array_agg(b.bucket ORDER BY b.bucket) AS buckets,
       array_agg(coalesce(s.processed, 0)::bigint ORDER BY b.bucket) AS processed,
       array_agg(coalesce(s.failed, 0)::bigint ORDER BY b.bucket) AS failed,
       array_agg(coalesce(s.dead_lettered, 0)::bigint ORDER BY b.bucket) AS dead_lettered,
       array_agg(s.parked ORDER BY b.bucket) AS parked,
       array_agg(s.outbox_pending ORDER BY b.bucket) AS outbox_pending,
       array_agg(s.outbox_lag_s ORDER BY b.bucket) AS outbox_lag_s
FROM span,
     generate_series(span.first, span.last, $4::interval) AS b(bucket)
     CROSS JOIN routes r
     LEFT JOIN summed s ON s.route = r.route AND s.bucket = b.bucket
GROUP BY r.route
"""


async def snapshot(conn: Conn, routes: Sequence[tuple[str, str]] = CHARTED) -> bool:
    """This minute's snapshot of `routes` ((route, consumer) pairs), unless it is taken
    already. Returns whether this call took it."""
    status = await conn.execute(
        _SNAPSHOT, [r for r, _ in routes], [c for _, c in routes], EXACT_UP_TO
    )
    return status != "INSERT 0 0"


async def read(conn: Conn, window: Window, routes: Sequence[tuple[str, str]] = CHARTED) -> Trends:
    """The window's buckets for `routes` ((route, consumer) pairs; see the module docstring)."""
    rows = await conn.fetch(
        _READ,
        [r for r, _ in routes],
        [c for _, c in routes],
        EXACT_UP_TO,
        window.step,
        window.buckets,
    )
    # One row per route, each series an array over the buckets (far cheaper to decode than a
    # row per bucket: a day is 288 buckets of every route).
    found = {row["route"]: row for row in rows}
    return Trends(
        window,
        list(rows[0]["buckets"]) if rows else [],
        {
            route: RouteTrend(
                processed=list(found[route]["processed"]),
                failed=list(found[route]["failed"]),
                dead_lettered=list(found[route]["dead_lettered"]),
                parked=list(found[route]["parked"]),
                outbox_pending=list(found[route]["outbox_pending"]),
                outbox_lag_s=list(found[route]["outbox_lag_s"]),
            )
            for route, _ in routes
        },
    )


# Critical time (migration 0028): per route and minute, applied messages counted by the bucket
# of their critical time (infra/observability.py CRITICAL_BOUNDS), written by the batch's
# counters part (batch_write.count_moves). The ring's rows younger than an hour are the last
# hour: this minute and the 59 before it.
_READ_CRITICAL = """
SELECT route, bucket, sum(count)::bigint AS count
FROM telecom.critical_minutes
WHERE route = ANY($1::text[]) AND at > date_trunc('minute', now()) - interval '1 hour'
GROUP BY route, bucket
"""


@dataclass(frozen=True, slots=True)
class Critical:
    """A route's critical time over the last hour, from its bucket counts."""

    count: int
    p50: float | None
    """Seconds, approximate (None: nothing applied in the hour)."""
    p99: float | None


def quantile(q: float, counts: Sequence[int], bounds: Sequence[float]) -> float | None:
    """The `q` quantile of what was counted in fixed buckets (`counts[i]`: how many fell at or
    below `bounds[i]` and above the bound before): found in its bucket by linear interpolation
    between the bucket's bounds, as Prometheus' histogram_quantile does; so only as exact as
    the buckets are narrow. None when nothing was counted."""
    total = sum(counts)
    if total == 0:
        return None
    rank = q * total
    seen = 0
    for i, n in enumerate(counts):
        if n and seen + n >= rank:
            low = bounds[i - 1] if i > 0 else 0.0
            return low + (bounds[i] - low) * (rank - seen) / n
        seen += n
    return float(bounds[len(counts) - 1])


async def read_critical(
    conn: Conn, bounds: Sequence[float], routes: Sequence[str] = tuple(ROUTES)
) -> dict[str, Critical]:
    """Each route's critical time over the last hour (p50 and p99, approximate: `quantile`)."""
    counts = {route: [0] * len(bounds) for route in routes}
    for row in await conn.fetch(_READ_CRITICAL, list(routes)):
        if row["bucket"] < len(bounds):
            counts[row["route"]][row["bucket"]] += row["count"]
    return {
        route: Critical(sum(found), quantile(0.5, found, bounds), quantile(0.99, found, bounds))
        for route, found in counts.items()
    }
