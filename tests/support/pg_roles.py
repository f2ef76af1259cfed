"""The Postgres roles of one test session, as in production: an owner that migrates and a
runtime role that every spawned `pkgq` process connects as (README, Roles).

Roles are cluster-wide, so each session names its own, and two sessions on one machine never
revoke or drop each other's.
"""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit
from uuid import uuid4

_SESSION = uuid4().hex[:8]
OWNER = f"pkgq_test_owner_{_SESSION}"
RUNTIME = f"pkgq_test_runtime_{_SESSION}"


def as_role(dsn: str, role: str) -> str:
    """The DSN with its user replaced by `role` (no password: trust on loopback)."""
    parts = urlsplit(dsn)
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{role}@{host}"))


CREATE_SQL = f"""
CREATE ROLE {OWNER} LOGIN NOSUPERUSER CREATEDB NOCREATEROLE;
CREATE ROLE {RUNTIME} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE;
"""
"""As deploy/local/ensure-services.sh creates pkgq_owner and pkgq_runtime on a dev box."""
