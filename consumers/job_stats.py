"""The job-queue stats: how many messages each route holds in each state (xqueue's states),
and the transitions.

States (a message is in one of them at a time):
- R ready: due in the outbox but not yet published, or ready on the broker;
- T taken: delivered to a consumer and not yet acknowledged (the broker's unacked count, from
  the management API; None when it cannot be read, and then ready counts come over AMQP);
- W waiting: scheduled in the outbox for later (a delay or a retry), or parked behind an earlier
  message of its user;
- B buried: in the dead-letter store, not replayed or discarded (expired ones apart: `expired`);
- Z zombie: processed, its record kept for audit and dedup until retention prunes it;
- D done: processed (the `ack` transition count).

Transitions: put, take, ack, release (a retry scheduled), bury, dig, plow, ttl (expired), ttr
(ran past the route's TTR and given back), delete (a processed record pruned).

The figures from Postgres are read cheaply (infra/postgres/stats.py: counters, counts that stop
at stats.EXACT_UP_TO, estimates past it); a row's `estimated` names the states and details that
are estimates. The console's overview and `pkgq stats` both show these.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from events.routes import ROUTES
from infra.postgres import stats, transitions
from infra.postgres.pool import Conn
from infra.postgres.transitions import TRANSITIONS
from infra.rabbit.management import QueueFigures, queue_depths, queue_figures
from infra.rabbit.topology import route_queues
from infra.settings import Settings

STATES = ("ready", "taken", "waiting", "buried", "zombie", "done")
_MADE_OF = {
    "ready": ("pending",),
    "waiting": ("scheduled", "parked"),
    "buried": ("dead_letters",),
    "zombie": ("kept",),
    "expired": ("expired",),
    "outbox_pending": ("pending",),
    "scheduled": ("scheduled",),
    "parked": ("parked",),
    "processed_1m": ("processed_1m",),
    "failed_1m": ("failed_1m",),
}
"""Each state or detail shown, by the Postgres figures it adds up (stats.RouteFigures)."""


async def route_stats(settings: Settings, conn: Conn) -> dict[str, dict[str, Any]]:
    figures = await stats.per_route(conn)
    moves = await transitions.totals(conn)
    queues = {route: [q for q, _ in route_queues(settings, route)] for route in ROUTES}
    broker = await queue_figures(settings, [q for names in queues.values() for q in names])
    if broker is None:  # no management API: ready and consumers over AMQP, taken unknown
        broker = {}
        for route in ROUTES:
            for depth in await queue_depths(settings, route):
                if depth["ready"] is not None:
                    broker[depth["queue"]] = QueueFigures(depth["ready"], -1, depth["consumers"])
    table: dict[str, dict[str, Any]] = {}
    for route in ROUTES:
        db = figures.of(route)
        guessed = figures.estimated.get(route, set())
        counted: Counter[str] = moves.get(route) or Counter()
        on_broker = [broker[q] for q in queues[route] if q in broker]
        broker_ready = sum(f.ready for f in on_broker)
        known = all(f.unacked >= 0 for f in on_broker)
        taken = sum(f.unacked for f in on_broker) if known else None
        row: dict[str, Any] = {
            "ready": db.get("pending", 0) + broker_ready,
            "taken": taken,
            "waiting": db.get("scheduled", 0) + db.get("parked", 0),
            "buried": db.get("dead_letters", 0),
            "zombie": db.get("kept", 0),
            "done": counted.get("ack", 0),
            "expired": db.get("expired", 0),
            "detail": {
                "outbox_pending": db.get("pending", 0),
                "broker_ready": broker_ready,
                "scheduled": db.get("scheduled", 0),
                "parked": db.get("parked", 0),
                "consumers": sum(f.consumers for f in on_broker),
                "processed_1m": db.get("processed_1m", 0),
                "failed_1m": db.get("failed_1m", 0),
            },
            "transitions": {t: counted.get(t, 0) for t in TRANSITIONS},
            "estimated": sorted(k for k, parts in _MADE_OF.items() if guessed & set(parts)),
        }
        table[route] = row
    return table
