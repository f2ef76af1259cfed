"""PKGQ_WEB_TRUSTED_PROXIES (consumers/web/config.py): addresses and CIDR networks, given
comma-separated or as a JSON list, every entry checked, and nobody trusted when it is unset."""

from __future__ import annotations

from ipaddress import ip_network

import pytest
from pydantic import ValidationError

from consumers.web.config import WebSettings

EXPECTED = [ip_network("10.0.0.0/8"), ip_network("127.0.0.1/32"), ip_network("fd00::/8")]


@pytest.mark.parametrize(
    "value",
    [
        "10.0.0.0/8,127.0.0.1,fd00::/8",
        " 10.0.0.0/8 , 127.0.0.1,, fd00::/8 ,",
        '["10.0.0.0/8", "127.0.0.1", "fd00::/8"]',
    ],
    ids=["comma-separated", "comma-separated-with-blanks", "json-list"],
)
def test_trusted_proxies_are_read_from_the_environment_comma_separated_or_as_json(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv("PKGQ_WEB_TRUSTED_PROXIES", value)
    assert WebSettings().trusted_proxies == EXPECTED


@pytest.mark.parametrize("value", [None, "", " "], ids=["unset", "empty", "blank"])
def test_no_proxy_is_trusted_unless_one_is_named(
    monkeypatch: pytest.MonkeyPatch, value: str | None
) -> None:
    monkeypatch.delenv("PKGQ_WEB_TRUSTED_PROXIES", raising=False)
    if value is not None:
        monkeypatch.setenv("PKGQ_WEB_TRUSTED_PROXIES", value)
    assert WebSettings().trusted_proxies == []


@pytest.mark.parametrize(
    ("entry", "why"),
    [
        ("10.0.0.300", "does not appear to be an IPv4 or IPv6 network"),
        ("10.0.0.1/8", "has host bits set"),  # 10.0.0.0/8 was meant, or 10.0.0.1
        ("ingress.local", "does not appear to be an IPv4 or IPv6 network"),
        ("*", "does not appear to be an IPv4 or IPv6 network"),  # trusting all is refused
    ],
)
def test_an_entry_that_is_no_address_or_network_is_refused_by_name(
    monkeypatch: pytest.MonkeyPatch, entry: str, why: str
) -> None:
    monkeypatch.setenv("PKGQ_WEB_TRUSTED_PROXIES", f"127.0.0.1,{entry}")
    with pytest.raises(ValidationError) as refused:
        WebSettings()
    [error] = refused.value.errors()
    assert error["loc"] == ("trusted_proxies",)
    assert f"{entry!r} is not an IP address or a CIDR network" in error["msg"]
    assert why in error["msg"]


def test_a_json_list_that_does_not_parse_is_refused_as_json(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PKGQ_WEB_TRUSTED_PROXIES", '["10.0.0.0/8",')
    with pytest.raises(ValidationError, match="not a JSON list of addresses"):
        WebSettings()


def test_trusted_proxies_given_in_code_are_checked_the_same_way() -> None:
    assert WebSettings(trusted_proxies=["127.0.0.1"]).trusted_proxies == [ip_network("127.0.0.1")]
    with pytest.raises(ValidationError, match="'localhost' is not an IP address"):
        WebSettings(trusted_proxies=["localhost"])
