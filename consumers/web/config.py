"""The console's settings: PKGQ_WEB_* in the environment (or systemd credential files named
like them, lower-case: `pkgq_web_secret`, `pkgq_web_users`, `pkgq_web_tokens`)."""

from __future__ import annotations

import ipaddress
import json
import os
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

Role = Literal["viewer", "operator"]
Network = ipaddress.IPv4Network | ipaddress.IPv6Network


class WebUser(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    role: Role
    password: str
    """A hash from `pkgq web hash-password` (scrypt, see auth.py), never the password itself."""


class WebToken(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    role: Role
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    """The hex sha256 of the bearer token (`pkgq web new-token` prints both)."""


class WebSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="PKGQ_WEB_", extra="ignore")

    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)
    secret: str = ""
    """Signs the session cookies: at least 32 characters, the same on every replica."""
    users: dict[str, WebUser] = Field(default_factory=dict)
    """Console logins, e.g. {"alice": {"role": "operator", "password": "scrypt$..."}}."""
    tokens: dict[str, WebToken] = Field(default_factory=dict)
    """API bearer tokens by name, e.g. {"node-mgmt": {"role": "viewer", "sha256": "..."}}."""
    session_ttl: int = Field(default=8 * 3600, ge=60)
    """Seconds a login lasts, however active the session is."""
    secure_cookies: bool = False
    """Send the session cookie over HTTPS only (set it behind a TLS-terminating proxy)."""
    pool_max_size: int = Field(default=10, ge=1)
    """Postgres connections of the process: kept open, shared by every request."""
    access_log: bool = False
    login_failures: int = Field(default=5, ge=1)
    """Failed sign-ins as one user name within PKGQ_WEB_LOGIN_WINDOW before the next waits."""
    login_address_failures: int = Field(default=20, ge=1)
    """The same from one client address (looser: an untrusted proxy's users share one)."""
    login_window: float = Field(default=300.0, gt=0)
    """Seconds a failed sign-in counts against its name and address."""
    trusted_proxies: Annotated[list[Network], NoDecode] = Field(default_factory=list)
    """Proxies (addresses and CIDR networks) whose X-Forwarded-For and X-Forwarded-Proto are
    believed, e.g. `10.0.0.0/8,127.0.0.1` or a JSON list; empty: nobody's (the headers are
    ignored, and the client is whoever connected)."""

    @field_validator("trusted_proxies", mode="before")
    @classmethod
    def _networks(cls, value: object) -> object:
        return proxy_networks(value) if isinstance(value, str | list | tuple) else value

    @classmethod
    def load(cls) -> WebSettings:
        credentials = os.environ.get("CREDENTIALS_DIRECTORY")
        if credentials and os.path.isdir(credentials):
            return cls(_secrets_dir=credentials)
        return cls()

    def problems(self) -> list[str]:
        """Why the console cannot start with these settings (empty: it can)."""
        found = []
        if len(self.secret) < 32:
            found.append(
                "PKGQ_WEB_SECRET must be set to at least 32 random characters "
                '(python3 -c "import secrets; print(secrets.token_urlsafe(32))")'
            )
        if not self.users and not self.tokens:
            found.append(
                "no PKGQ_WEB_USERS or PKGQ_WEB_TOKENS: nobody could sign in "
                "(create one with `pkgq web hash-password`)"
            )
        return found


def proxy_networks(value: str | list[object] | tuple[object, ...]) -> list[Network]:
    """PKGQ_WEB_TRUSTED_PROXIES: comma-separated (`10.0.0.0/8, 127.0.0.1`) or a JSON list; each
    entry an IP address or a CIDR network, anything else refused by name."""
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            try:
                value = json.loads(text)  # a list, or an error: it starts with "["
            except json.JSONDecodeError as exc:
                raise ValueError(f"not a JSON list of addresses: {exc}") from None
        else:
            value = [entry for entry in text.split(",") if entry.strip()]
    return [_network(entry) for entry in value]


def _network(entry: object) -> Network:
    if isinstance(entry, ipaddress.IPv4Network | ipaddress.IPv6Network):
        return entry
    try:
        return ipaddress.ip_network(str(entry).strip())
    except ValueError as exc:
        raise ValueError(
            f"{entry!r} is not an IP address or a CIDR network ({exc}); "
            "PKGQ_WEB_TRUSTED_PROXIES takes e.g. 10.0.0.0/8,127.0.0.1"
        ) from None
