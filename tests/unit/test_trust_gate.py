"""Which publisher each route trusts, and the roles the definitions give the broker."""

from __future__ import annotations

import re
from uuid import uuid4

import pytest

from consumers.delivery.decode import decode_all
from events.decoding import RawDelivery
from events.models import AllPackageExpiredEvent, RecordUsage
from events.routes import (
    ALL_EXPIRED,
    ALL_ROUTES,
    INBOUND_ROUTES,
    UNTRUSTED_PUBLISHER,
    USAGE_RECORD,
)
from infra.rabbit.roles import DEFAULT_USERS, inbound_keys_pattern, role_definitions
from infra.settings import Settings
from tests.support.deliveries import raw_for


def published_by(raw: RawDelivery, publisher: str | None) -> RawDelivery:
    return RawDelivery(
        body=raw.body,
        message_id=raw.message_id,
        message_type=raw.message_type,
        content_type=raw.content_type,
        timestamp=raw.timestamp,
        headers=raw.headers,
        publisher=publisher,
    )


def test_only_the_four_commands_are_inbound() -> None:
    assert sorted(r.short_name for r in INBOUND_ROUTES.values()) == [
        "package_cancel",
        "package_purchase",
        "quota_adjust",
        "usage_record",
    ]


@pytest.mark.parametrize("publisher", [None, "shop", "pkgq-publisher"])
def test_a_lifecycle_event_not_published_by_pkgq_is_untrusted(publisher: str | None) -> None:
    raw = published_by(
        raw_for(ALL_EXPIRED, AllPackageExpiredEvent(user_id=uuid4(), expired_at=0)), publisher
    )
    ready, bad = decode_all(ALL_EXPIRED, [raw], max_body_bytes=2**20, trusted_publisher="pkgq")
    assert ready == []
    assert [b.problem.reason for b in bad] == [UNTRUSTED_PUBLISHER]


def test_a_lifecycle_event_published_by_pkgq_is_decoded() -> None:
    raw = published_by(
        raw_for(ALL_EXPIRED, AllPackageExpiredEvent(user_id=uuid4(), expired_at=0)), "pkgq"
    )
    ready, bad = decode_all(ALL_EXPIRED, [raw], max_body_bytes=2**20, trusted_publisher="pkgq")
    assert (len(ready), bad) == (1, [])


@pytest.mark.parametrize("publisher", [None, "shop", "pkgq"])
def test_an_inbound_command_is_taken_from_any_publisher(publisher: str | None) -> None:
    raw = published_by(
        raw_for(USAGE_RECORD, RecordUsage(user_id=uuid4(), upload=1, download=0)), publisher
    )
    ready, bad = decode_all(USAGE_RECORD, [raw], max_body_bytes=2**20, trusted_publisher="pkgq")
    assert (len(ready), bad) == (1, [])


def test_the_publisher_topic_permission_admits_exactly_the_inbound_routing_keys() -> None:
    pattern = re.compile(inbound_keys_pattern())
    for route in ALL_ROUTES.values():
        for key in (route.name, f"{route.name}.p3"):
            assert bool(pattern.match(key)) == route.inbound, key
    assert not pattern.match("telecom.usage_record.x")
    assert not pattern.match("telecom.package_activate.usage_record")


def test_the_roles_keep_the_dlx_and_the_queues_to_the_runtime_which_configures_nothing() -> None:
    settings = Settings(exchange="telecom", queue_prefix="pkgq")
    roles = role_definitions(settings, "/", DEFAULT_USERS)
    permissions = {p["user"]: p for p in roles["permissions"]}
    writers_of_dlx = sorted(
        u for u, p in permissions.items() if re.match(p["write"], "telecom.dlx")
    )
    assert writers_of_dlx == [DEFAULT_USERS.runtime]
    assert permissions[DEFAULT_USERS.runtime]["configure"] == "^$"
    assert not any(re.match(p["write"], "amq.default") for p in permissions.values())
    readers = sorted(
        u for u, p in permissions.items() if re.match(p["read"], "pkgq.telecom.usage_record")
    )
    assert readers == [DEFAULT_USERS.runtime]
    autoscaler = permissions[DEFAULT_USERS.autoscaler]
    assert (autoscaler["configure"], autoscaler["write"], autoscaler["read"]) == ("^$",) * 3
    assert not any("password" in key for user in roles["users"] for key in user)


@pytest.mark.parametrize(
    ("url", "user"),
    [
        ("amqp://pkgq:secret@rabbit:5672/", "pkgq"),
        ("amqps://svc%2Fpkgq:secret@rabbit/prod", "svc/pkgq"),
        ("amqp://rabbit/", "guest"),  # AMQP's default login, as aio-pika uses it
    ],
)
def test_pkgqs_own_user_is_the_user_of_its_amqp_url(url: str, user: str) -> None:
    assert Settings(amqp_url=url).amqp_user == user
