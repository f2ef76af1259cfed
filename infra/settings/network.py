"""How long this process waits on an unanswering PostgreSQL or RabbitMQ: at start-up, and on a
connection whose peer went silent."""

from __future__ import annotations

from pydantic import BaseModel, Field


class NetworkSettings(BaseModel):
    """Connections and network faults."""

    dead_peer_timeout: float = Field(default=5.0, ge=1, le=600)
    """Seconds after which this process takes a PostgreSQL or RabbitMQ connection whose peer
    stopped answering for dead: closes it and connects again, on a short capped backoff, so
    work resumes within about two seconds of the network's return (TCP_USER_TIMEOUT and
    keepalive on every socket, the AMQP heartbeat, connect timeouts:
    docs/how-to/network-faults.md). Lower finds a silent fault sooner; on a link whose round
    trips or losses can exceed it, raise it."""
    startup_wait: float = Field(default=60.0, gt=0)
    """Seconds `pkgq run` and `pkgq relay` wait for Postgres and RabbitMQ at start-up (an
    outage, or a certificate not accepted) before they exit."""
