"""The relay (the outbox's publisher) and the housekeeping it runs under leases: the expiry
sweep, retention and the invariant checks."""

from __future__ import annotations

from pydantic import BaseModel, Field


class RelaySettings(BaseModel):
    """The relay and its housekeeping."""

    relay_batch_size: int = Field(default=200, ge=1, le=10_000)
    relay_confirm_timeout: float = Field(default=5.0, gt=0, le=300)
    """Seconds the relay waits for the broker to confirm one message. A publish not confirmed
    in time fails, the row stays due, and the relay opens a new channel (and, if that does not
    help, a new connection, through the node list or the load balancer) before it retries: a
    channel that has stopped confirming (a partitioned node) is never used again."""
    relay_stall_after: float = Field(default=60.0, gt=0)
    """Seconds without a healthy round (one that published what it claimed, or found nothing
    due) after which the relay counts as stalled: `relay_stalled` is logged as an error,
    `pkgq_relay_stalled` is 1, /readyz fails, and the relay reconnects to the broker."""
    relay_poll_interval: float = Field(default=1.0, gt=0)
    sweep_grace: float = Field(default=60.0, ge=0)
    """A time expiry this many seconds overdue, with no pending or recent trigger, is re-sent."""

    retention: float = Field(default=7 * 86400.0, ge=60)
    """Seconds that processed-message records (the inbox), published outbox rows, finished
    addresses and groups are kept for audit and dedup before they are pruned."""
    prune_batch_size: int = Field(default=5000, ge=1, le=1_000_000)
    housekeeping_interval: float = Field(default=30.0, gt=0)
    """How often the relay runs the lease-guarded jobs: the expiry sweep and retention."""
    invariant_check_interval: float = Field(default=60.0, ge=0)
    """How often the relay runs the invariant checks (`pkgq doctor`'s), under a lease, stores
    their results and exports pkgq_invariant_violations; 0: never."""
