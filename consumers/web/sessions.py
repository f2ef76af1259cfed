"""Console sessions that end: kept on the server (telecom.web_sessions), not in the cookie.

The signed cookie (Starlette's SessionMiddleware, PKGQ_WEB_SECRET) carries a random session id
and the CSRF token; Postgres holds the id's sha256 with who signed in. Every console request
looks its session up (one statement on the primary key), so:
- signing out deletes the row: a copy of the cookie taken before is refused afterwards;
- "sign out everywhere" deletes every row of the user;
- signing in always makes a new id and deletes the one the browser had (no session fixation:
  an id someone planted before the sign-in never becomes a signed-in session);
- a session lasts PKGQ_WEB_SESSION_TTL from its sign-in, however busy;
- a session whose user was removed from PKGQ_WEB_USERS, or whose role or password changed, is
  ended when it is next presented, and at the console's start-up.
The id is random (32 bytes), so a sha256 suffices to store it, as for the API's bearer tokens.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

import asyncpg
import structlog
from fastapi import Request

from consumers.web.auth import Principal, check_password
from consumers.web.config import WebSettings, WebUser
from infra.postgres import web_sessions

log = structlog.get_logger(__name__)

SID = "sid"
"""The session id's key in the signed cookie."""
_UNRESOLVED = object()


def _digest(text: str) -> bytes:
    return hashlib.sha256(text.encode()).digest()


def _credential(user: WebUser) -> bytes:
    """What a session remembers of the user's password: the sha256 of its hash (a changed
    password ends the sessions signed in with the old one)."""
    return _digest(user.password)


def _pool(request: Request) -> asyncpg.Pool:
    found: asyncpg.Pool = request.app.state.pool
    return found


async def sign_in(request: Request, web: WebSettings, name: str, password: str) -> bool:
    """Check the credentials; on success start a new session under a new id (the one the
    browser had, if any, ends) with a new CSRF token."""
    user = await check_password(web, name, password)
    if user is None:
        return False
    previous = request.session.get(SID)
    sid = secrets.token_urlsafe(32)
    await web_sessions.start(
        _pool(request),
        _digest(sid),
        name,
        user.role,
        _credential(user),
        web.session_ttl,
        replacing=_digest(previous) if isinstance(previous, str) else None,
    )
    request.session.clear()
    request.session.update({SID: sid, "csrf": secrets.token_urlsafe(32)})
    request.state.who = Principal(name, user.role, "session")
    return True


async def principal(request: Request) -> Principal | None:
    """The signed-in user, if the request's session is valid (looked up once per request)."""
    cached = getattr(request.state, "who", _UNRESOLVED)
    if cached is not _UNRESOLVED:
        return cached if isinstance(cached, Principal) else None
    who = await _look_up(request)
    request.state.who = who
    return who


async def _look_up(request: Request) -> Principal | None:
    sid = request.session.get(SID)
    if not isinstance(sid, str):
        return None
    web: WebSettings = request.app.state.web
    pool = _pool(request)
    id_hash = _digest(sid)
    found = await web_sessions.find(pool, id_hash, web.session_ttl)
    if found is None:  # signed out, ended everywhere, expired: the browser forgets the id
        request.session.pop(SID, None)
        return None
    user = web.users.get(found.user_name)
    if user is None:
        why = "user removed from PKGQ_WEB_USERS"
    elif user.role != found.role:
        why = "role changed"
    elif not hmac.compare_digest(_credential(user), found.credential):
        why = "password changed"
    else:
        return Principal(found.user_name, user.role, "session")
    await web_sessions.end(pool, id_hash)
    request.session.pop(SID, None)
    log.info("web_session_ended", user=found.user_name, reason=why)
    return None


async def sign_out(request: Request) -> None:
    """End this browser's session on the server, and forget it in the browser."""
    sid = request.session.get(SID)
    if isinstance(sid, str):
        await web_sessions.end(_pool(request), _digest(sid))
    request.session.clear()
    request.state.who = None


async def sign_out_everywhere(request: Request, who: Principal) -> int:
    """End every session of the signed-in user (this one included); how many there were."""
    ended = await web_sessions.end_all(_pool(request), who.name)
    request.session.clear()
    request.state.who = None
    log.info("web_signed_out_everywhere", user=who.name, sessions=ended)
    return ended


async def end_unconfigured(pool: asyncpg.Pool, web: WebSettings) -> None:
    """At start-up: end the sessions of users no longer in PKGQ_WEB_USERS, or whose role or
    password changed, presented since or not (a user removed and later added back does not
    find their old sessions open)."""
    users = [(name, user.role, _credential(user)) for name, user in web.users.items()]
    ended = await web_sessions.end_all_but(pool, users)
    if ended:
        log.info("web_sessions_ended_at_start", sessions=ended)
