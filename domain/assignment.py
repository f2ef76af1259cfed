"""Which live replica owns which partition of a route (pure): rendezvous hashing, also called
highest random weight (Thaler and Ravishankar, 1996).

Every replica of a route computes the same answer from the same inputs (the route, its
partition count and the set of live replica ids), with nothing to coordinate: each partition
goes to the replica whose weight for it is highest. A weight depends on the partition and the
replica alone, so when a replica joins it takes only the partitions where it now weighs most
(about P/N of them, from every other replica alike), and when one leaves only its own
partitions move, each to the replica that weighed second for it. Nothing else moves.

The weight is the first 8 bytes of BLAKE2b over `route`, the partition and the replica id: the
same on every machine and Python version (unlike `hash()`), and spread evenly enough that no
replica is favoured. Ties (probability 2**-64) are broken by the replica id.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping


def weight(route: str, partition: int, replica: str) -> int:
    """The replica's weight for one partition of a route: a 64-bit number."""
    digest = hashlib.blake2b(f"{route}\x00{partition}\x00{replica}".encode(), digest_size=8)
    return int.from_bytes(digest.digest(), "big")


def owner(route: str, partition: int, replicas: Iterable[str]) -> str | None:
    """The replica that owns the partition among `replicas` (None: there is none)."""
    best: tuple[int, str] | None = None
    for replica in replicas:
        candidate = (weight(route, partition, replica), replica)
        if best is None or candidate > best:
            best = candidate
    return None if best is None else best[1]


def assign(route: str, partitions: int, replicas: Iterable[str]) -> dict[int, str]:
    """Every partition 0..partitions-1 of the route, with its owner; {} without replicas."""
    live = sorted(set(replicas))
    if not live:
        return {}
    return {k: owner(route, k, live) or live[0] for k in range(partitions)}


def owned_by(route: str, partitions: int, replicas: Iterable[str], replica: str) -> frozenset[int]:
    """The partitions of the route that `replica` owns among `replicas` (it counts itself
    whether or not it is listed: a replica always assigns as one of the live ones)."""
    everyone = {*replicas, replica}
    return frozenset(k for k, who in assign(route, partitions, everyone).items() if who == replica)


def moved(before: Mapping[int, str], after: Mapping[int, str]) -> frozenset[int]:
    """The partitions whose owner differs between two assignments."""
    return frozenset(k for k in {*before, *after} if before.get(k) != after.get(k))
