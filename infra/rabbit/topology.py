"""Exchanges, queues and bindings, declared idempotently by every process at start-up."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any
from uuid import UUID

import aio_pika
import structlog
from aio_pika.abc import AbstractChannel, AbstractExchange, AbstractQueue
from aiormq.exceptions import ChannelNotFoundEntity, ChannelPreconditionFailed

from events.partitioning import partition_key, routing_key
from events.routes import ALL_ROUTES, INBOUND_ROUTES, SUBSCRIBER_ROUTES, Route
from infra.rabbit.roles import DEFAULT_USERS, RoleUsers, role_definitions
from infra.settings import Settings

log = structlog.get_logger(__name__)

MAX_PRIORITY = 2
"""Message priorities are 0-2, higher is more urgent."""
SUBSCRIBER_QUEUE_MAX_LENGTH = 100_000
"""Messages a subscriber route's own queue keeps (the newest; older ones are dropped)."""


def queue_arguments(settings: Settings, route_name: str) -> dict[str, Any]:
    """Durable, dead-lettering into the DLX, one active consumer at a time.

    Single-active-consumer keeps a route's messages in order when several `pkgq run` replicas
    subscribe: one consumes, the others stand by and take over if it goes away.

    Classic queues (the default) honour message priorities 0-2 (`x-max-priority`). Quorum queues
    (the replicated profile, `queue_type = "quorum"` by default or per route) are declared
    without it, since RabbitMQ before 4.0 ignores priorities on them: there only the relay's
    claim order (`priority DESC, id`) ranks by priority. They dead-letter at least once
    (`x-dead-letter-strategy`, which needs `x-overflow=reject-publish`: the broker keeps a
    dead letter in the source queue until the dead-letter queue has confirmed it, so one lost
    node loses none), and carry an explicit delivery limit (Settings.delivery_limit).

    A subscriber route's queue (pkgq publishes, outside systems consume) keeps the newest
    SUBSCRIBER_QUEUE_MAX_LENGTH messages: it exists so that the relay's mandatory publish is
    routed, and must not grow without bound while no subscriber reads it. What it drops is not
    dead-lettered (the events are announcements; the state they announce is in Postgres). A
    subscriber that must see every event binds a queue of its own.
    """
    quorum = settings.queue_type_for(route_name) == "quorum"
    if route_name in SUBSCRIBER_ROUTES:
        return {
            "x-queue-type": "quorum" if quorum else "classic",
            "x-max-length": SUBSCRIBER_QUEUE_MAX_LENGTH,
            "x-overflow": "drop-head",
        }
    if quorum:
        return {
            "x-dead-letter-exchange": settings.dlx,
            "x-dead-letter-strategy": "at-least-once",
            "x-delivery-limit": settings.delivery_limit,
            "x-overflow": "reject-publish",
            "x-queue-type": "quorum",
            "x-single-active-consumer": True,
        }
    return {
        "x-dead-letter-exchange": settings.dlx,
        "x-max-priority": MAX_PRIORITY,
        "x-queue-type": "classic",
        "x-single-active-consumer": True,
    }


def dead_letter_queue_arguments(settings: Settings) -> dict[str, Any]:
    """`pkgq.dead_letters`, where the broker's dead letters and the unroutable ones wait for the
    ingester: a quorum queue when quorum is the default type (PKGQ_QUEUE_TYPE), so that it is on
    every node and a lost node holds none of them back. It dead-letters nothing itself, and has
    no delivery limit (there would be nowhere to put what it gave up on)."""
    return {"x-queue-type": "quorum" if settings.queue_type == "quorum" else "classic"}


def exchange_arguments(settings: Settings) -> dict[str, Any]:
    """The main exchange's: its alternate exchange, which takes what no queue is bound for."""
    return {"alternate-exchange": settings.unroutable_exchange}


def unroutable_keys() -> list[str]:
    """What the alternate exchange passes on to the dead-letter queue: the inbound routes'
    keys, plain or partitioned (`#` matches nothing as well as `.p<k>`).

    Only those: outsiders publish them, and without this a publish to the plain key of a
    partitioned route, or with a stale partition map, would be dropped (or only returned to a
    publisher that asked with `mandatory`). pkgq's own relay publishes every route with
    `mandatory`, and a row it cannot route stays in the outbox and is retried (the ingester
    files what the alternate exchange catches as an `unroutable` dead letter instead): for the
    lifecycle and internal routes, which no outsider publishes, the return is the better
    answer, and an unbound key on the alternate exchange keeps it."""
    return [f"{route.name}.#" for route in INBOUND_ROUTES.values()]


def definitions(
    settings: Settings, vhost: str = "/", users: RoleUsers | None = DEFAULT_USERS
) -> dict[str, Any]:
    """The topology `declare_all` makes, as a RabbitMQ definitions document (for
    `rabbitmqctl import_definitions` or the management plugin's load_definitions), so that
    operators can provision the broker ahead of the processes. With `users`, also the roles'
    users (without passwords) and their permissions (infra/rabbit/roles.py); None: the
    topology alone."""

    def exchange(name: str, arguments: dict[str, Any] | None = None) -> dict[str, Any]:
        return {
            "name": name,
            "vhost": vhost,
            "type": "topic",
            "durable": True,
            "auto_delete": False,
            "internal": False,
            "arguments": arguments or {},
        }

    def queue(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        return {
            "name": name,
            "vhost": vhost,
            "durable": True,
            "auto_delete": False,
            "arguments": arguments,
        }

    def binding(source: str, destination: str, key: str) -> dict[str, Any]:
        return {
            "source": source,
            "vhost": vhost,
            "destination": destination,
            "destination_type": "queue",
            "routing_key": key,
            "arguments": {},
        }

    queues = [queue(settings.dead_letter_queue, dead_letter_queue_arguments(settings))]
    bindings = [binding(settings.dlx, settings.dead_letter_queue, "#")]
    bindings += [
        binding(settings.unroutable_exchange, settings.dead_letter_queue, key)
        for key in unroutable_keys()
    ]
    for route in ALL_ROUTES.values():
        for name, key in route_queues(settings, route.name):
            queues.append(queue(name, queue_arguments(settings, route.name)))
            bindings.append(binding(settings.exchange, name, key))
    document: dict[str, Any] = {}
    if users is not None:
        document.update(role_definitions(settings, vhost, users))
    document.update(
        {
            "exchanges": [
                exchange(settings.exchange, exchange_arguments(settings)),
                exchange(settings.dlx),
                exchange(settings.unroutable_exchange),
            ],
            "queues": queues,
            "bindings": bindings,
        }
    )
    return document


async def declare_exchanges(
    channel: AbstractChannel, settings: Settings
) -> tuple[AbstractExchange, AbstractExchange]:
    if not settings.declare_topology:
        # Provisioned from the definitions: passive checks need no configure permission.
        try:
            exchange = await channel.get_exchange(settings.exchange, ensure=True)
            dlx = await channel.get_exchange(settings.dlx, ensure=True)
            await channel.declare_queue(settings.dead_letter_queue, passive=True)
        except ChannelNotFoundEntity as exc:
            raise TopologyMissingError(str(exc)) from exc
        return exchange, dlx
    dlx = await channel.declare_exchange(settings.dlx, aio_pika.ExchangeType.TOPIC, durable=True)
    unroutable = await channel.declare_exchange(
        settings.unroutable_exchange, aio_pika.ExchangeType.TOPIC, durable=True
    )
    try:
        dead_letters = await channel.declare_queue(
            settings.dead_letter_queue,
            durable=True,
            arguments=dead_letter_queue_arguments(settings),
        )
    except ChannelPreconditionFailed as exc:
        raise TopologyMismatchError(settings.dead_letter_queue, str(exc)) from exc
    await dead_letters.bind(dlx, routing_key="#")
    for key in unroutable_keys():
        await dead_letters.bind(unroutable, routing_key=key)
    return await _declare_main_exchange(channel, settings), dlx


async def _declare_main_exchange(channel: AbstractChannel, settings: Settings) -> AbstractExchange:
    try:
        return await channel.declare_exchange(
            settings.exchange,
            aio_pika.ExchangeType.TOPIC,
            durable=True,
            arguments=exchange_arguments(settings),
        )
    except ChannelPreconditionFailed as exc:
        # Declared by an older pkgq, without its alternate exchange. An exchange's arguments
        # cannot change in place: keep working as before, and say how to add it.
        log.warning(
            "alternate_exchange_missing",
            exchange=settings.exchange,
            error=str(exc),
            fix=f"rabbitmqctl set_policy pkgq-unroutable '^{settings.exchange}$' "
            f'\'{{"alternate-exchange":"{settings.unroutable_exchange}"}}\' '
            "--apply-to exchanges (an exchange's own argument wins over a policy)",
        )
        await channel.reopen()  # the refused declare closed the channel
        return await channel.get_exchange(settings.exchange, ensure=True)


class TopologyMismatchError(Exception):
    """A queue exists on the broker with other arguments than this version of pkgq declares."""

    def __init__(self, queue: str, detail: str) -> None:
        super().__init__(
            f"queue {queue!r} already exists with different arguments ({detail}). RabbitMQ "
            f"cannot change a queue's arguments in place: stop its consumers, let it drain "
            f"(or move its messages), delete it with `rabbitmqctl delete_queue {queue}`, and "
            f"start again so that pkgq declares it anew."
        )
        self.queue = queue


class TopologyMissingError(TopologyMismatchError):
    """PKGQ_DECLARE_TOPOLOGY is false and an exchange or queue the broker should have been
    provisioned with is missing."""

    def __init__(self, detail: str) -> None:
        Exception.__init__(
            self,
            f"the broker lacks pkgq's topology ({detail}). With PKGQ_DECLARE_TOPOLOGY=false "
            f"pkgq only checks it: provision it first with `pkgq definitions > defs.json` and "
            f"`rabbitmqctl import_definitions defs.json` (or declare it once as the operator).",
        )
        self.queue = ""


def route_queues(settings: Settings, route_name: str) -> list[tuple[str, str]]:
    """(queue, binding key) of each partition of a route: `pkgq.<route>` when it has one,
    `pkgq.<route>.p<k>` bound to `<route>.p<k>` when it has several."""
    count = settings.partitions_for(route_name)
    return [
        (settings.queue_name(key), key)
        for key in (partition_key(route_name, k, count) for k in range(count))
    ]


def routing_key_for(settings: Settings, route_name: str, user_id: UUID | None) -> str:
    """Where a message for `user_id` on a route is published: its partition's key."""
    return routing_key(route_name, user_id, settings.partitions_for(route_name))


async def declare_route_queue(
    channel: AbstractChannel,
    settings: Settings,
    exchange: AbstractExchange,
    route: Route,
    partition: int = 0,
) -> AbstractQueue:
    name, key = route_queues(settings, route.name)[partition]
    if not settings.declare_topology:
        try:  # passive: provisioned with its binding from the definitions
            return await channel.declare_queue(name, passive=True)
        except ChannelNotFoundEntity as exc:
            raise TopologyMissingError(str(exc)) from exc
    try:
        queue = await channel.declare_queue(
            name, durable=True, arguments=queue_arguments(settings, route.name)
        )
    except ChannelPreconditionFailed as exc:
        raise TopologyMismatchError(name, str(exc)) from exc
    await queue.bind(exchange, routing_key=key)
    return queue


async def declare_all(
    channel: AbstractChannel, settings: Settings, routes: Iterable[Route] | None = None
) -> None:
    """Declare the exchanges, the dead-letter queue and every route's queue."""
    exchange, _ = await declare_exchanges(channel, settings)
    for route in routes if routes is not None else ALL_ROUTES.values():
        for partition in range(settings.partitions_for(route.name)):
            await declare_route_queue(channel, settings, exchange, route, partition)


async def delete_all(channel: AbstractChannel, settings: Settings) -> None:
    """Remove everything `declare_all` made (used by tests to clean up their namespace)."""
    for route in ALL_ROUTES.values():
        for queue, _ in route_queues(settings, route.name):
            await channel.queue_delete(queue)
    await channel.queue_delete(settings.dead_letter_queue)
    await channel.exchange_delete(settings.exchange)
    await channel.exchange_delete(settings.dlx)
    await channel.exchange_delete(settings.unroutable_exchange)
