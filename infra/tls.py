"""TLS for pkgq's connections: the context `amqps://` connects with, and a failed TLS
handshake told as one line that says what failed, which file was used and what to check.

RabbitMQ: an `amqps://` URL always verifies the broker's certificate and host name, against
PKGQ_AMQP_CA_FILE if set (else the system's trusted CAs); PKGQ_AMQP_CERT_FILE and
PKGQ_AMQP_KEY_FILE add a client certificate. There is no switch that turns verification off.

PostgreSQL: libpq's own DSN parameters, which asyncpg reads on every connection pkgq opens
(the pools, the relay's listener, the heartbeat, `pkgq migrate`): `sslmode=verify-full`
and `sslrootcert=<CA file>`, with `sslcert` and `sslkey` for a client certificate.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Iterator
from dataclasses import dataclass
from urllib.parse import parse_qs, unquote, urlsplit


class TlsError(Exception):
    """A TLS failure, explained in one line (str(exc)); the original is its __cause__."""


class TlsVerifyError(TlsError, ConnectionError):
    """The server's certificate was not accepted. An outage to the retry logic (it waits, as
    for a server that is down: the operator may be rotating certificates), and one that needs
    an operator (infra/transient.py, needs_operator)."""


class TlsConfigError(TlsError, ValueError):
    """A CA, certificate or key file that cannot be loaded: a configuration mistake that no
    retry cures."""


@dataclass(frozen=True, slots=True)
class TlsTarget:
    """What a connection goes to, for the one-line explanation of a failure."""

    service: str
    """"RabbitMQ" or "PostgreSQL"."""
    address: str
    """host:port as the URL or DSN names it."""
    ca_file: str | None
    """The CA file the server was verified against (None: the system's trusted CAs)."""
    ca_setting: str
    """Where the CA file is configured, e.g. "PKGQ_AMQP_CA_FILE"."""
    files: tuple[tuple[str, str], ...] = ()
    """(setting, path) of every TLS file in use, checked when loading fails."""


def amqp_context(
    ca_file: str | None, cert_file: str | None, key_file: str | None
) -> ssl.SSLContext:
    """The context of an `amqps://` connection: the server's certificate and host name are
    verified (against `ca_file`, or the system's CAs), with a client certificate if given."""
    target = TlsTarget(
        "RabbitMQ",
        "",
        ca_file,
        "PKGQ_AMQP_CA_FILE",
        tuple(
            (name, path)
            for name, path in (
                ("PKGQ_AMQP_CA_FILE", ca_file),
                ("PKGQ_AMQP_CERT_FILE", cert_file),
                ("PKGQ_AMQP_KEY_FILE", key_file),
            )
            if path
        ),
    )
    try:
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca_file)
        if cert_file:
            context.load_cert_chain(cert_file, key_file)
    except (OSError, ssl.SSLError) as exc:
        raise TlsConfigError(_unloadable(target, exc)) from exc
    context.check_hostname = True
    context.verify_mode = ssl.CERT_REQUIRED
    return context


def postgres_target(dsn: str, setting: str = "PKGQ_POSTGRES_DSN") -> TlsTarget:
    """The TLS files a DSN names (libpq's sslrootcert, sslcert, sslkey) and its address."""
    parts = urlsplit(dsn)
    query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    root = query.get("sslrootcert")
    if root is None and query.get("sslmode") in ("verify-ca", "verify-full"):
        root = os.path.expanduser("~/.postgresql/root.crt")  # libpq's default, as asyncpg's
    host = unquote(parts.hostname or query.get("host") or "localhost")
    port = parts.port or query.get("port") or 5432
    files = tuple(
        (f"{key} in {setting}", path)
        for key, path in (
            ("sslrootcert", root),
            *((k, query.get(k)) for k in ("sslcert", "sslkey")),
        )
        if path
    )
    return TlsTarget("PostgreSQL", f"{host}:{port}", root, f"sslrootcert in {setting}", files)


def explain(exc: BaseException, target: TlsTarget) -> str | None:
    """One line for a connection failure caused by TLS (None: TLS is not what failed)."""
    for cause in _chain(exc):
        if isinstance(cause, TlsError):
            return str(cause)
        if isinstance(cause, ssl.SSLCertVerificationError):
            return _unverified(target, cause)
        if isinstance(cause, ssl.SSLError):
            reason = cause.reason or str(cause)
            return (
                f"TLS with {target.service} at {target.address} failed: {reason}. Check that "
                f"the server has TLS on and that the client certificate and key "
                f"({_listed(target) or 'none set'}) are ones it accepts."
            )
        if isinstance(cause, OSError) and _unreadable(target):
            return _unloadable(target, cause)
        if type(cause).__name__ == "ClientConfigurationError":  # asyncpg's, on a missing root
            return f"TLS with {target.service} at {target.address} is misconfigured: {cause}."
    return None


def _unverified(target: TlsTarget, error: ssl.SSLCertVerificationError) -> str:
    reason = str(error.verify_message or error.reason or error).rstrip(".")
    ca = (
        f"the CA file {target.ca_file} ({target.ca_setting})"
        if target.ca_file
        else f"the system's trusted CAs ({target.ca_setting} is not set)"
    )
    if "hostname" in reason.lower() or "ip address mismatch" in reason.lower():
        check = (
            f"connect with a host name the server's certificate is issued for, or have it "
            f"reissued to include {target.address.rpartition(':')[0]}"
        )
    else:
        check = "check that it holds the CA that signed the server's certificate"
    return (
        f"TLS with {target.service} at {target.address} failed: the server's certificate was "
        f"not accepted ({reason}), verified against {ca}: {check}."
    )


def _unloadable(target: TlsTarget, exc: BaseException) -> str:
    detail = getattr(exc, "strerror", None) or getattr(exc, "reason", None) or str(exc)
    bad = [f"{path} ({name})" for name, path in target.files if not _readable(path)]
    files = ", ".join(bad) or _listed(target) or "none set"
    return (
        f"TLS with {target.service}: cannot load {files}: {detail}. Check the path and that "
        "this process may read it."
    )


def _listed(target: TlsTarget) -> str:
    return ", ".join(f"{path} ({name})" for name, path in target.files)


def _unreadable(target: TlsTarget) -> bool:
    return any(not _readable(path) for _, path in target.files)


def _readable(path: str) -> bool:
    return os.path.isfile(path) and os.access(path, os.R_OK)


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def external_auth(amqp_url: str) -> bool:
    """Whether the URL logs in to RabbitMQ by its client certificate alone (SASL EXTERNAL,
    `?auth=external`, read by aiormq): no password anywhere."""
    query = parse_qs(urlsplit(amqp_url).query)
    return [value.lower() for value in query.get("auth", [])] == ["external"]


def amqp_tls_problem(
    amqp_url: str, ca_file: str | None, cert_file: str | None, key_file: str | None
) -> str | None:
    """Why these RabbitMQ TLS settings cannot work together (None: they can)."""
    parts = urlsplit(amqp_url)
    amqps = parts.scheme.lower() == "amqps"
    files = [
        name
        for name, value in (
            ("PKGQ_AMQP_CA_FILE", ca_file),
            ("PKGQ_AMQP_CERT_FILE", cert_file),
            ("PKGQ_AMQP_KEY_FILE", key_file),
        )
        if value
    ]
    if files and not amqps:
        return (
            f"{', '.join(files)} set but PKGQ_AMQP_URL is not amqps://: the connection would "
            "not use TLS at all"
        )
    if key_file and not cert_file:
        return "PKGQ_AMQP_KEY_FILE set without PKGQ_AMQP_CERT_FILE"
    if external_auth(amqp_url):
        if not (amqps and cert_file):
            return (
                "PKGQ_AMQP_URL asks for ?auth=external (a login by client certificate): it needs "
                "amqps:// and PKGQ_AMQP_CERT_FILE"
            )
        if not parts.username or parts.password:
            return (
                "PKGQ_AMQP_URL with ?auth=external names the certificate's user and no password: "
                "amqps://<common name>@host:5671/?auth=external (pkgq stamps that name on its "
                "messages as user_id, and the broker checks it against the login)"
            )
    return None
