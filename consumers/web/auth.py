"""Who is asking, and may they: password hashes, bearer tokens, two roles (viewer reads,
operator acts) and CSRF tokens on every form. Console sessions are in sessions.py.

Password hashes are hashlib.scrypt in one self-describing string:
`scrypt$<log2 N>$<r>$<p>$<salt, urlsafe base64>$<key, urlsafe base64>` (N=2^15, r=8, p=1, a
16-byte salt, a 32-byte key). Bearer tokens are random (32 bytes), stored as their sha256: a
token is as strong as its randomness, so a slow hash would only slow the read API down.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import hashlib
import hmac
import secrets
from dataclasses import dataclass

from fastapi import HTTPException, Request

from consumers.web.config import Role, WebSettings, WebUser

_LOG_N, _R, _P, _KEY = 15, 8, 1, 32
_RANK = {"viewer": 0, "operator": 1}


def hash_password(password: str, *, log_n: int = _LOG_N) -> str:
    salt = secrets.token_bytes(16)
    key = _scrypt(password, salt, log_n, _R, _P)
    return "$".join(["scrypt", str(log_n), str(_R), str(_P), _b64(salt), _b64(key)])


def verify_password(password: str, stored: str) -> bool:
    """Whether `password` matches a hash_password() string (False for a malformed one)."""
    try:
        kind, log_n, r, p, salt, key = stored.split("$")
        if kind != "scrypt" or not 10 <= int(log_n) <= 20:
            return False
        expected = base64.urlsafe_b64decode(key)
        actual = _scrypt(password, base64.urlsafe_b64decode(salt), int(log_n), int(r), int(p))
    except ValueError:
        return False
    return hmac.compare_digest(actual, expected)


def _scrypt(password: str, salt: bytes, log_n: int, r: int, p: int) -> bytes:
    n = 1 << log_n
    return hashlib.scrypt(
        password.encode(), salt=salt, n=n, r=r, p=p, dklen=_KEY, maxmem=256 * n * r
    )


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode()


def new_token() -> tuple[str, str]:
    """A new bearer token and the sha256 to put in PKGQ_WEB_TOKENS."""
    token = secrets.token_urlsafe(32)
    return token, hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class Principal:
    name: str
    role: Role
    via: str
    """`session` or `token`."""

    @property
    def actor(self) -> str:
        """How actions are recorded: `web:alice` (console), `token:node-mgmt` (API)."""
        return f"{'web' if self.via == 'session' else 'token'}:{self.name}"

    def may(self, role: Role) -> bool:
        return _RANK[self.role] >= _RANK[role]


class LoginRequiredError(Exception):
    """No valid session on a console page: the app redirects to the login form."""


async def check_password(web: WebSettings, name: str, password: str) -> WebUser | None:
    """The configured user, if `password` is theirs. The hash runs in a thread: tens of
    milliseconds of CPU that must not stall the event loop."""
    user = web.users.get(name)
    # Unknown names cost a hash too, so that a timing does not tell which names exist.
    stored = user.password if user is not None else _dummy_hash()
    matches = await asyncio.to_thread(verify_password, password, stored)
    return user if matches else None


@functools.cache
def _dummy_hash() -> str:
    return hash_password(secrets.token_urlsafe(16))


def token_principal(request: Request, web: WebSettings) -> Principal | None:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token:
        return None
    digest = hashlib.sha256(token.strip().encode()).hexdigest()
    for name, entry in web.tokens.items():
        if hmac.compare_digest(digest, entry.sha256):
            return Principal(name, entry.role, "token")
    return None


def csrf_token(request: Request) -> str:
    """The session's CSRF token (made for an anonymous session too: the login form has one)."""
    token = request.session.get("csrf")
    if not isinstance(token, str):
        token = secrets.token_urlsafe(32)
        request.session["csrf"] = token
    return token


async def checked_form(request: Request) -> dict[str, str]:
    """The posted form, refused with 403 unless it carries the session's CSRF token."""
    form = await request.form()
    sent = form.get("csrf")
    expected = request.session.get("csrf")
    if not isinstance(sent, str) or not isinstance(expected, str):
        raise HTTPException(403, "missing CSRF token: reload the page and submit the form again")
    if not hmac.compare_digest(sent, expected):
        raise HTTPException(403, "wrong CSRF token: reload the page and submit the form again")
    return {k: v for k, v in form.multi_items() if isinstance(v, str) and k != "csrf"}
