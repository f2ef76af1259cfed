"""A random purchase-and-usage workload and the end state a reference model predicts for it.

Purchases are sent first; usage follows once every user's first item is active. No package has
a duration, so the outcome depends only on per-user order, which pkgq must preserve.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass, field
from uuid import UUID

import asyncpg
from aio_pika.abc import AbstractRobustConnection

from events.models import PurchasePackage, RecordUsage
from events.routes import PACKAGE_PURCHASE, USAGE_RECORD
from infra.settings import Settings
from tests.support.deliveries import Sending, add_package
from tests.support.observing import eventually

USERS = int(os.environ.get("PKGQ_E2E_USERS", "12"))
"""Scale the end-to-end workload up with PKGQ_E2E_USERS (CI uses the small default)."""


@dataclass
class UserPlan:
    user: UUID
    purchases: list[tuple[int, int]]  # (package id, amount)
    usages: list[tuple[int, int]]  # (upload, download)
    limits: list[int] = field(default_factory=list)

    def expected(self) -> tuple[list[tuple[str, int]], int, int, int, int]:
        """(status, used) per item, activations, expirations, all_expired, unbilled bytes."""
        used = [0] * len(self.limits)
        current = 0
        unbilled = 0
        for up, down in self.usages:
            if current < len(self.limits):
                used[current] += up + down
                if used[current] >= self.limits[current]:
                    current += 1
            else:
                unbilled += up + down
        statuses = [
            ("consumed" if i < current else "active" if i == current else "in_queue", used[i])
            for i in range(len(self.limits))
        ]
        activations = min(current + 1, len(self.limits))
        all_expired = 1 if current == len(self.limits) else 0
        return statuses, activations, current, all_expired, unbilled


@dataclass
class Workload:
    plans: list[UserPlan]

    @classmethod
    async def create(cls, pool: asyncpg.Pool, seed: int, users: int = USERS) -> Workload:
        rng = random.Random(seed)
        packages = {limit: await add_package(pool, limit) for limit in (500, 1000, 2500)}
        plans = []
        for _ in range(users):
            # From the seed too, so a seed is one workload: which partitions its users fall in
            # (and so which replica works on each) is the same in every run.
            plan = UserPlan(UUID(int=rng.getrandbits(128), version=4), [], [])
            for _ in range(rng.randint(1, 3)):
                limit = rng.choice(list(packages))
                amount = rng.randint(1, 2)
                plan.purchases.append((packages[limit], amount))
                plan.limits.extend([limit] * amount)
            budget = int(sum(plan.limits) * rng.uniform(0.3, 1.3))
            while budget > 0:
                chunk = min(budget, rng.randint(50, 900))
                up = rng.randint(0, chunk)
                plan.usages.append((up, chunk - up))
                budget -= chunk
            plans.append(plan)
        return cls(plans)

    @property
    def users(self) -> list[UUID]:
        return [p.user for p in self.plans]

    async def send_purchases(self, settings: Settings, amqp: AbstractRobustConnection) -> None:
        async with Sending(settings, amqp) as sending:
            for plan in self.plans:
                for package, amount in plan.purchases:
                    body = PurchasePackage(user_id=plan.user, package_id=package, amount=amount)
                    await sending.send(PACKAGE_PURCHASE, body)

    async def send_usage(
        self,
        settings: Settings,
        amqp: AbstractRobustConnection,
        part: tuple[float, float] = (0.0, 1.0),
    ) -> None:
        """Send each user's usage records in order, users interleaved; `part` selects a share
        of every user's list (e.g. the first half, then the second)."""
        rng = random.Random(len(self.plans))
        lists = {
            p.user: p.usages[int(len(p.usages) * part[0]) : int(len(p.usages) * part[1])]
            for p in self.plans
        }
        cursors = {user: 0 for user in lists}
        pending = [user for user, usages in lists.items() if usages]
        async with Sending(settings, amqp) as sending:
            while pending:  # interleave users, keep each user's own order
                user = rng.choice(pending)
                up, down = lists[user][cursors[user]]
                usage = RecordUsage(user_id=user, upload=up, download=down)
                await sending.send(USAGE_RECORD, usage)
                cursors[user] += 1
                if cursors[user] == len(lists[user]):
                    pending.remove(user)

    async def wait_all_queued(self, pool: asyncpg.Pool, within: float = 60) -> None:
        total = sum(len(p.limits) for p in self.plans)

        async def all_active() -> bool:
            async with pool.acquire() as conn:
                items = await conn.fetchval(
                    "SELECT count(*) FROM telecom.package_queue WHERE user_id = ANY($1::uuid[])",
                    self.users,
                )
                active = await conn.fetchval(
                    "SELECT count(*) FROM telecom.package_queue "
                    "WHERE status = 'active' AND user_id = ANY($1::uuid[])",
                    self.users,
                )
            return bool(items == total and active == len(self.plans))

        await eventually(all_active, within=within)

    async def actual(self, pool: asyncpg.Pool) -> dict[UUID, tuple[list[tuple[str, int]], int]]:
        async with pool.acquire() as conn:
            rows = await conn.fetch(
                "SELECT user_id, status::text AS status, upload + download AS used "
                "FROM telecom.package_queue WHERE user_id = ANY($1::uuid[]) "
                "ORDER BY created_at, id",
                self.users,
            )
            users = await conn.fetch(
                "SELECT user_id, unbilled_upload + unbilled_download AS unbilled "
                "FROM telecom.queue_users WHERE user_id = ANY($1::uuid[])",
                self.users,
            )
        state: dict[UUID, tuple[list[tuple[str, int]], int]] = {p.user: ([], 0) for p in self.plans}
        for r in rows:
            state[r["user_id"]][0].append((r["status"], r["used"]))
        for u in users:
            state[u["user_id"]] = (state[u["user_id"]][0], u["unbilled"])
        return state

    def expected_state(self) -> dict[UUID, tuple[list[tuple[str, int]], int]]:
        out = {}
        for plan in self.plans:
            statuses, _, _, _, unbilled = plan.expected()
            out[plan.user] = (statuses, unbilled)
        return out

    async def wait_end_state(self, pool: asyncpg.Pool, within: float = 90) -> None:
        expected = self.expected_state()

        async def matches() -> bool:
            try:
                return await self.actual(pool) == expected
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
                return False  # Postgres is restarting; ask again

        try:
            await eventually(matches, within=within, every=0.5)
        except AssertionError:
            actual = await self.actual(pool)
            diff = {
                str(u): {"expected": expected[u], "actual": actual.get(u)}
                for u in expected
                if expected[u] != actual.get(u)
            }
            raise AssertionError(f"end state differs for {len(diff)} users: {diff}") from None
