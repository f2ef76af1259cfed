"""TLS for pkgq's connections: the context `amqps://` connects with, and a failed TLS
handshake told as one line that says what failed, which file was used and what to check.

RabbitMQ: an `amqps://` URL always verifies the broker's certificate and host name, against
PKGQ_AMQP_CA_FILE if set (else the system's trusted CAs); PKGQ_AMQP_CERT_FILE and
PKGQ_AMQP_KEY_FILE add a client certificate. There is no switch that turns verification off.

PostgreSQL: libpq's own DSN parameters, which asyncpg reads on every connection pkgq opens
(the pools, the relay's listener, the heartbeat, `pkgq migrate`): `sslmode=verify-full`
and `sslrootcert=<CA file>`, with `sslcert` and `sslkey` for a client certificate. A DSN that
says nothing (no `sslmode`, no PGSSLMODE) means libpq's `prefer`: TLS whenever the server has it
on, unverified. pkgq keeps that for a server elsewhere, but to a server on this host (every host
of the DSN a loopback address, `localhost` or a Unix socket) it connects as `allow`: in plain
text, and over TLS only if the server insists (`hostssl`). Traffic that never leaves the kernel
gains nothing from unverified TLS, and it cost a quarter of a consumer's CPU in `pkgq bench`.
"""

from __future__ import annotations

import ipaddress
import os
import ssl
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal
from urllib.parse import parse_qs, unquote, urlsplit

DEFAULT_POSTGRES_PORT = 5432


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


@dataclass(frozen=True, slots=True)
class PostgresDsn:
    """What a libpq-style DSN names, read as asyncpg reads it (asyncpg/connect_utils.py):
    every host of a multi-host DSN (`postgresql://u@h1:5433,h2:5434/db`, each with its own port
    or the default), or the `host=` and `port=` parameters when the DSN names no host in its
    authority; IPv6 hosts in brackets (`[::1]:5432`). Never raises: what cannot be read is kept
    as written, for it is shown in messages (asyncpg itself refuses it when connecting)."""

    hosts: tuple[tuple[str, str], ...]
    """(host, port) in the order they are tried; a host is unquoted, without brackets."""
    database: str
    """The path's database name (unquoted), else `dbname=` or `database=`; "" if none."""
    query: dict[str, str]
    """The parameters (the last of each name)."""
    named_hosts: bool = True
    """Whether the DSN names its hosts (in its authority or `host=`); else asyncpg takes them
    from PGHOST or a service file, and `hosts` is only libpq's default, localhost."""

    @property
    def address(self) -> str:
        """Every host:port, comma-separated, as in "127.0.0.1:5433,127.0.0.1:5434"."""
        return ",".join(f"{_bracketed(host)}:{port}" for host, port in self.hosts)


def postgres_ssl(dsn: str) -> Literal["allow"] | None:
    """asyncpg's `ssl` for `dsn` (see the module): "allow" for a DSN that names its hosts, all
    on this machine, and no sslmode (nor PGSSLMODE, nor a service that may set one); None (the
    DSN's own sslmode, or libpq's `prefer`) for any other."""
    parsed = parse_postgres_dsn(dsn)
    if not parsed.named_hosts or {"sslmode", "ssl", "service", "servicefile"} & set(parsed.query):
        return None  # hosts from PGHOST, or a service file's own sslmode: left as libpq has it
    if os.environ.get("PGSSLMODE") or os.environ.get("PGSERVICE"):
        return None
    if parsed.hosts and all(_on_this_host(host) for host, _ in parsed.hosts):
        return "allow"
    return None


def _on_this_host(host: str) -> bool:
    if host.startswith("/") or host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def parse_postgres_dsn(dsn: str) -> PostgresDsn:
    """The DSN's hosts, ports, database and parameters (see PostgresDsn); never raises."""
    scheme_sep = dsn.find("://")
    rest = dsn[scheme_sep + 3 :] if scheme_sep >= 0 else dsn
    rest, _, query_text = rest.partition("?")
    query_text = query_text.partition("#")[0]
    authority, slash, path = rest.partition("/")
    hostspec = authority.rpartition("@")[2]
    query = {key: values[-1] for key, values in parse_qs(query_text).items()}
    if hostspec:
        hosts = _hostlist(hostspec, None, unquoted=True)
    else:
        ports = [p.strip() for p in query.get("port", "").split(",")] if query.get("port") else []
        hosts = _hostlist(query.get("host") or "localhost", ports or None, unquoted=False)
    if slash and path:
        database = unquote(path)
    elif slash:
        database = ""  # asyncpg sends "" (the server takes the user's name) and reads no dbname=
    else:
        database = query.get("dbname") or query.get("database") or ""
    return PostgresDsn(tuple(hosts), database, query, bool(hostspec) or "host" in query)


def _hostlist(spec: str, ports: list[str] | None, *, unquoted: bool) -> list[tuple[str, str]]:
    """asyncpg's _parse_hostlist: `ports` (the `port=` parameter) wins over a host's own."""
    hosts: list[tuple[str, str]] = []
    specs = spec.split(",")
    overriding = bool(ports)  # `port=` wins over a host's own port; PGPORT only fills in
    if not ports and os.environ.get("PGPORT"):
        ports = [p.strip() for p in os.environ["PGPORT"].split(",")]
    for i, item in enumerate(specs):
        item = item.strip()
        if item.startswith("["):
            host, _, tail = item[1:].partition("]")
            own_port = tail[1:] if tail.startswith(":") else ""
        elif item.startswith("/") or item.count(":") > 1:
            host, own_port = item, ""  # a Unix socket's directory, or a bare IPv6 address
        else:
            host, _, own_port = item.partition(":")
        if unquoted:
            host, own_port = unquote(host), unquote(own_port)
        if ports and (overriding or not own_port):
            port = ports[i] if len(ports) == len(specs) else ports[0]
        else:
            port = own_port
        hosts.append((host or "localhost", port or str(DEFAULT_POSTGRES_PORT)))
    return hosts


def _bracketed(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("/") else host


def postgres_target(dsn: str, setting: str = "PKGQ_POSTGRES_DSN") -> TlsTarget:
    """The TLS files a DSN names (libpq's sslrootcert, sslcert, sslkey) and its address: every
    host of a multi-host DSN ("127.0.0.1:5433,127.0.0.1:5434"). Never raises: it is called
    on the way out of a failed connection, whose error must not be replaced by its own."""
    parsed = parse_postgres_dsn(dsn)
    query = parsed.query
    root = query.get("sslrootcert")
    if root is None and query.get("sslmode") in ("verify-ca", "verify-full"):
        root = os.path.expanduser("~/.postgresql/root.crt")  # libpq's default, as asyncpg's
    files = tuple(
        (f"{key} in {setting}", path)
        for key, path in (
            ("sslrootcert", root),
            *((k, query.get(k)) for k in ("sslcert", "sslkey")),
        )
        if path
    )
    return TlsTarget("PostgreSQL", parsed.address, root, f"sslrootcert in {setting}", files)


def explain(exc: BaseException, target: TlsTarget) -> str | None:
    """One line for a connection failure caused by TLS (None: TLS is not what failed)."""
    for cause in causes(exc):
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
            f"reissued to include {' and '.join(_host_names(target.address))}"
        )
    else:
        check = "check that it holds the CA that signed the server's certificate"
    return (
        f"TLS with {target.service} at {target.address} failed: the server's certificate was "
        f"not accepted ({reason}), verified against {ca}: {check}."
    )


def _host_names(address: str) -> list[str]:
    """The host names of "host:port" or of a comma-separated list of them, each named once."""
    names = (part.strip().rpartition(":")[0] or part.strip() for part in address.split(","))
    return list(dict.fromkeys(name.strip("[]") for name in names if name))


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


def causes(exc: BaseException) -> Iterator[BaseException]:
    """`exc`, then its causes and contexts, each once."""
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
