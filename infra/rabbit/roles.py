"""The broker half of the trust boundary: RabbitMQ users and what each may do.

Outsiders publish commands (purchase, usage, cancel, quota adjust); only pkgq publishes its
lifecycle events and internal messages. One `telecom` topic exchange carries both, and topic
permissions (write, over routing keys) confine the publisher and operator roles to the
inbound routes: a second exchange would have moved every binding and every outside publisher
for nothing the routing-key check does not already give. pkgq checks it again on its side
(consumers/delivery/decode.py): a lifecycle consumer takes only what pkgq's own user
published, so a broker provisioned too loosely still cannot forge a lifecycle event.

RabbitMQ's permissions, as they apply here: `configure` declares and deletes exchanges and
queues; `write` publishes to an exchange (and binds a queue, with `read` on the exchange);
`read` consumes from a queue. Passive declarations (does this queue exist, how deep is it)
need none of them. The default exchange routes to any queue by name, so no role may write to
it (`amq.default` matches none of the patterns below).

The users are listed without passwords: `rabbitmqctl change_password USER` after the import.
Importing a user again clears its password, so re-provision the topology alone with
`pkgq definitions --no-users`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from events.routes import INBOUND_ROUTES
from infra.settings import Settings


@dataclass(frozen=True, slots=True)
class RoleUsers:
    """The user name of each role (the runtime one must be the user in PKGQ_AMQP_URL)."""

    runtime: str = "pkgq"
    publisher: str = "pkgq-publisher"
    operator: str = "pkgq-operator"
    autoscaler: str = "pkgq-autoscaler"


DEFAULT_USERS = RoleUsers()


def inbound_keys_pattern() -> str:
    """The routing keys of the inbound routes, plain or partitioned (`.p<k>`)."""
    names = "|".join(re.escape(r.short_name) for r in INBOUND_ROUTES.values())
    return rf"^telecom\.({names})(\.p[0-9]+)?$"


def role_definitions(settings: Settings, vhost: str, users: RoleUsers) -> dict[str, Any]:
    """The users, permissions and topic permissions of a definitions document."""
    exchange, dlx = re.escape(settings.exchange), re.escape(settings.dlx)
    unroutable = re.escape(settings.unroutable_exchange)
    queues = re.escape(settings.queue_prefix) + r"\..*"
    tail_queues = re.escape(settings.queue_prefix) + r"\.tail\..*"
    nothing = "^$"

    def user(name: str, *tags: str) -> dict[str, Any]:
        return {"name": name, "tags": list(tags)}

    def permission(name: str, configure: str, write: str, read: str) -> dict[str, Any]:
        return {"user": name, "vhost": vhost, "configure": configure, "write": write, "read": read}

    def inbound_only(name: str, read: str = nothing) -> dict[str, Any]:
        return {
            "user": name,
            "vhost": vhost,
            "exchange": settings.exchange,
            "write": inbound_keys_pattern(),
            "read": read,
        }

    return {
        "users": [
            user(users.runtime),
            user(users.publisher),
            user(users.operator, "monitoring"),
            user(users.autoscaler, "monitoring"),
        ],
        "permissions": [
            # pkgq runtime (PKGQ_DECLARE_TOPOLOGY=false): publishes on both exchanges (the
            # relay; the last-resort copy to the DLX) and consumes its queues; declares nothing.
            permission(users.runtime, nothing, f"^({exchange}|{dlx})$", f"^{queues}$"),
            # publisher (shop, billing, admin tools): the exchange only, inbound keys only.
            permission(users.publisher, nothing, f"^{exchange}$", nothing),
            # operator: provisions and repairs the topology (declare, bind, delete queues after
            # repartitioning) and publishes commands; never consumes pkgq's queues, only the
            # temporary ones `pkgq tail` binds to both exchanges (<prefix>.tail.<random>).
            # The alternate exchange too: declaring it, and binding the dead-letter queue to it
            # (a binding needs read on its exchange).
            permission(
                users.operator,
                f"^({exchange}|{dlx}|{unroutable}|{queues})$",
                f"^({exchange}|{queues})$",
                f"^({exchange}|{dlx}|{unroutable}|{tail_queues})$",
            ),
            # autoscaler (KEDA): queue depths by passive declare or the management API.
            permission(users.autoscaler, nothing, nothing, nothing),
        ],
        # The operator binds queues to every route's key (a binding on a topic exchange needs
        # topic read on its key), `pkgq tail` with `#`; it still cannot consume pkgq's queues.
        "topic_permissions": [
            inbound_only(users.publisher),
            inbound_only(users.operator, read=".*"),
        ],
    }
