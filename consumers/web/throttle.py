"""Failed sign-ins, counted so that guessing passwords stays slow: after too many failures in a
window, for one user name or from one client address, the console refuses to check a password
for a while (429 with Retry-After) before it spends a password hash on it.

Per process: each console replica counts its own (a shared counter would be a Postgres write per
failure, for a limit an attacker spread over N replicas meets N times later). The address limit
is the looser one: behind a proxy not named in PKGQ_WEB_TRUSTED_PROXIES every user shares
its address (PKGQ_WEB_LOGIN_* settings, consumers/web/config.py).
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Limit:
    failures: int
    """How many failures the window may hold; the next attempt waits."""
    window: float
    """Seconds a failure counts for."""


class LoginThrottle:
    """Failures by key (`user:<name>`, `address:<ip>`), each a sliding window of timestamps.
    At most `max_keys` keys are remembered (the least recently failed go first), so a flood of
    made-up names cannot grow the process without bound."""

    def __init__(
        self,
        per_user: Limit,
        per_address: Limit,
        *,
        max_keys: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._limits = {"user": per_user, "address": per_address}
        self._max_keys = max_keys
        self._clock = clock
        self._failures: OrderedDict[str, deque[float]] = OrderedDict()

    def wait_for(self, user: str, address: str) -> int:
        """Whole seconds until a sign-in as `user` from `address` is checked again; 0: now."""
        now = self._clock()
        longest = 0.0
        for kind, key in self._keys(user, address):
            limit = self._limits[kind]
            recent = self._recent(key, now, limit)
            if len(recent) >= limit.failures:
                longest = max(longest, recent[-limit.failures] + limit.window - now)
        return math.ceil(longest) if longest > 0 else 0

    def attempt(self, user: str, address: str) -> None:
        """Count a sign-in as failed before its password is checked: sign-ins posted at once
        see each other, so no more of them than the limit allow spend a password hash."""
        now = self._clock()
        for _, key in self._keys(user, address):
            self._failures.setdefault(key, deque()).append(now)
            self._failures.move_to_end(key)
        while len(self._failures) > self._max_keys:
            self._failures.popitem(last=False)

    def succeeded(self, user: str, address: str) -> None:
        """The password was right: the user's failures are cleared, and the address's count
        loses this attempt only (one account's right password does not let its address go on
        guessing other names)."""
        user_key, address_key = (key for _, key in self._keys(user, address))
        self._failures.pop(user_key, None)
        counted = self._failures.get(address_key)
        if counted:
            counted.pop()
            if not counted:
                del self._failures[address_key]

    def tracked(self) -> int:
        """How many names and addresses have failures remembered."""
        return len(self._failures)

    def _recent(self, key: str, now: float, limit: Limit) -> deque[float]:
        found = self._failures.get(key, deque())
        while found and found[0] <= now - limit.window:
            found.popleft()
        if not found:
            self._failures.pop(key, None)
        return found

    @staticmethod
    def _keys(user: str, address: str) -> tuple[tuple[str, str], tuple[str, str]]:
        return ("user", f"user:{user[:200]}"), ("address", f"address:{address}")
