"""How a client socket finds out that its peer stopped answering (docs/how-to/network-faults.md).

A network that drops packets closes nothing: without help, a connection with unacknowledged
data waits out TCP's retransmission backoff (15 to 30 s after a 40 s fault here, up to about 15
minutes in all), and an idle one waits for ever. Every socket pkgq holds to PostgreSQL or
RabbitMQ gets, from PKGQ_DEAD_PEER_TIMEOUT (`timeout` below):

- `TCP_USER_TIMEOUT` = timeout: data sent and not acknowledged for that long ends the
  connection (ETIMEDOUT), whatever the retransmission backoff would wait;
- keepalive (`SO_KEEPALIVE`, idle = half the timeout, probes one second apart): an idle
  connection sends probes, and with TCP_USER_TIMEOUT set the kernel ends it once nothing has
  been received for the timeout and a probe is out, so a connection that only listens (a
  LISTEN, a consumer waiting for deliveries) is found dead too.

Both are the kernel's: no extra traffic while data flows, a few bytes a second while idle.
"""

from __future__ import annotations

import math
import socket
from typing import Any

DEFAULT_DEAD_PEER_TIMEOUT_S = 5.0
"""PKGQ_DEAD_PEER_TIMEOUT's default (infra/settings/network.py)."""


def options(timeout: float) -> list[tuple[int, int, int]]:
    """(level, option, value) for a TCP socket whose peer is dead after `timeout` seconds of
    silence (the module docstring). Linux's names; elsewhere what the platform lacks is left
    out."""
    idle = max(1, math.floor(timeout / 2))
    wanted = [
        (socket.SOL_SOCKET, "SO_KEEPALIVE", 1),
        (socket.IPPROTO_TCP, "TCP_KEEPIDLE", idle),
        (socket.IPPROTO_TCP, "TCP_KEEPINTVL", 1),
        (socket.IPPROTO_TCP, "TCP_KEEPCNT", max(1, math.ceil(timeout - idle))),
        (socket.IPPROTO_TCP, "TCP_USER_TIMEOUT", max(1, round(timeout * 1000))),
    ]
    return [
        (level, getattr(socket, name), value)
        for level, name, value in wanted
        if hasattr(socket, name)
    ]


def tune(sock: Any, timeout: float) -> bool:
    """Apply `options(timeout)` to `sock` (a socket, or asyncio's TransportSocket). False for
    what is not a TCP socket (a Unix socket to a local PostgreSQL: no network to fail)."""
    if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return False
    for level, option, value in options(timeout):
        sock.setsockopt(level, option, value)
    return True


def tune_transport(transport: Any, timeout: float) -> bool:
    """`tune` the socket under an asyncio transport (TLS included)."""
    if transport is None:
        return False
    return tune(transport.get_extra_info("socket"), timeout)
