"""The console's server-side sessions (migration 0023): one row per signed-in session, keyed by
the sha256 of the id its cookie carries (consumers/web/sessions.py decides what a session may
do; this module only stores them). Every console request reads its session with one statement
on the primary key; signing in, out, and out everywhere are one statement each."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import asyncpg

from infra.postgres.pool import Conn
from infra.postgres.pruning import Rule

RETENTION = Rule("web_sessions", "telecom.web_sessions", "id_hash", "expires_at < now()")
"""An expired session goes as soon as it has expired, whatever the retention."""
Source = asyncpg.Pool | Conn
"""The console's pool (each statement on whichever connection is free) or one connection."""


@dataclass(frozen=True, slots=True)
class StoredSession:
    user_name: str
    role: str
    credential: bytes
    """The sha256 of the user's password hash when they signed in."""


async def start(
    conn: Source,
    id_hash: bytes,
    user_name: str,
    role: str,
    credential: bytes,
    ttl_s: float,
    *,
    replacing: bytes | None = None,
) -> None:
    """Store a new session, valid for `ttl_s` seconds; `replacing`: the hash of the session the
    browser had before (ended in the same statement: a sign-in never keeps an older id)."""
    await conn.execute(
        """
        WITH ended AS (DELETE FROM telecom.web_sessions WHERE id_hash = $6)
        INSERT INTO telecom.web_sessions (id_hash, user_name, role, credential, expires_at)
        VALUES ($1, $2, $3, $4, now() + make_interval(secs => $5))
        """,
        id_hash,
        user_name,
        role,
        credential,
        float(ttl_s),
        replacing,
    )


async def find(conn: Source, id_hash: bytes, ttl_s: float) -> StoredSession | None:
    """The session with this id hash if it has not expired, by its own expiry or by `ttl_s`
    counted from its sign-in (a TTL lowered since applies at once). One index lookup."""
    row = await conn.fetchrow(
        """
        SELECT user_name, role, credential FROM telecom.web_sessions
        WHERE id_hash = $1 AND expires_at > now()
          AND signed_in_at > now() - make_interval(secs => $2)
        """,
        id_hash,
        float(ttl_s),
    )
    return StoredSession(**dict(row)) if row is not None else None


async def end(conn: Source, id_hash: bytes) -> bool:
    """End one session. False: there was none (ended before, or expired and pruned)."""
    ended = await conn.fetchval(
        "DELETE FROM telecom.web_sessions WHERE id_hash = $1 RETURNING true", id_hash
    )
    return bool(ended)


async def end_all(conn: Source, user_name: str) -> int:
    """End every session of one user; how many there were (expired ones included)."""
    rows = await conn.fetch(
        "DELETE FROM telecom.web_sessions WHERE user_name = $1 RETURNING 1", user_name
    )
    return len(rows)


async def end_all_but(conn: Source, users: Sequence[tuple[str, str, bytes]]) -> int:
    """End every session whose (user name, role, credential) is none of `users`: those of users
    removed from the console's settings or changed since; how many."""
    rows = await conn.fetch(
        """
        DELETE FROM telecom.web_sessions
        WHERE (user_name, role, credential) NOT IN (
            SELECT * FROM unnest($1::text[], $2::text[], $3::bytea[]))
        RETURNING 1
        """,
        [u[0] for u in users],
        [u[1] for u in users],
        [u[2] for u in users],
    )
    return len(rows)
