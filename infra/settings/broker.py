"""RabbitMQ: the node list, TLS, how frames are read and written, and pkgq's names on the
broker (the exchange, its dead-letter and alternate exchanges, the queues)."""

from __future__ import annotations

from typing import Self
from urllib.parse import parse_qs, urlsplit

from pydantic import BaseModel, field_validator, model_validator

from infra.settings.urls import mask_url, split_urls
from infra.tls import amqp_tls_problem

_AMQP_TLS_PARAMETERS = frozenset(
    {"cafile", "capath", "cadata", "certfile", "keyfile", "no_verify_ssl"}
)
"""aiormq's own URL parameters for TLS: refused, so that the settings are the one place TLS is
configured and verification cannot be turned off by a URL."""


class BrokerSettings(BaseModel):
    """RabbitMQ."""

    amqp_url: str = "amqp://guest:guest@127.0.0.1:5672/"
    """The broker, or the nodes of a cluster as a comma-separated list of URLs
    (`amqp://u:p@rabbit-1:5672/,amqp://u:p@rabbit-2:5672/`): pkgq connects to the first that
    answers and moves to another when its node goes away (infra/rabbit/connection.py). The
    nodes share one scheme, user and virtual host. One URL behind a load balancer (a
    Kubernetes Service) works as well."""
    amqp_ca_file: str | None = None
    """`amqps://` only: the CA file (PEM) the broker's certificate is verified against; unset:
    the system's trusted CAs. An amqps connection always verifies the certificate and the host
    name (docs/how-to/tls.md)."""
    amqp_cert_file: str | None = None
    """`amqps://` only: a client certificate (PEM, with its key unless PKGQ_AMQP_KEY_FILE)."""
    amqp_key_file: str | None = None
    """`amqps://` only: the client certificate's private key (PEM)."""
    declare_topology: bool = True
    """Declare the exchanges and queues at start-up. False: only check that they exist (the
    broker was provisioned from `pkgq definitions`), so the AMQP user needs no configure
    permission."""
    wire_accelerator: bool = True
    """Read and write AMQP frames through pkgq's wire accelerator (infra/rabbit/wire/): chunked
    frame reads, a delivery's frames decoded without pamqp's generic decoder, deliveries handed
    over in the channel's reader task, publishes coalesced into one write. false: aiormq's own
    code paths, the same bytes on the wire (slower)."""

    exchange: str = "telecom"
    """The topic exchange; its dead-letter exchange is `<exchange>.dlx`."""
    queue_prefix: str = "pkgq"
    """Queues are `<queue_prefix>.<route>`; dead letters go to `<queue_prefix>.dead_letters`."""

    management_url: str | None = None
    """The RabbitMQ management API (for taken counts in `pkgq stats`); default: the AMQP host on
    port 15672 with the AMQP credentials."""

    @field_validator("amqp_url")
    @classmethod
    def _no_tls_url_parameters(cls, value: str) -> str:
        given = sorted(
            {
                name
                for url in split_urls(value)
                for name in parse_qs(urlsplit(url).query, keep_blank_values=True)
            }
            & _AMQP_TLS_PARAMETERS
        )
        if given:
            raise ValueError(
                f"PKGQ_AMQP_URL has TLS parameter(s) {given}: set PKGQ_AMQP_CA_FILE, "
                "PKGQ_AMQP_CERT_FILE and PKGQ_AMQP_KEY_FILE instead (an amqps:// URL always "
                "verifies the broker's certificate)"
            )
        return value

    @field_validator("amqp_url")
    @classmethod
    def _nodes_alike(cls, value: str) -> str:
        urls = split_urls(value)
        if not urls:
            raise ValueError("PKGQ_AMQP_URL is empty")
        first = urlsplit(urls[0])
        for url in urls[1:]:
            other = urlsplit(url)
            if (other.scheme.lower(), other.username, other.path or "/", other.query) != (
                first.scheme.lower(),
                first.username,
                first.path or "/",
                first.query,
            ):
                raise ValueError(
                    f"PKGQ_AMQP_URL lists nodes that differ in scheme, user, virtual host or "
                    f"parameters ({mask_url(urls[0])} and {mask_url(url)}): the nodes of one "
                    "cluster are reached alike, only their host and port differ"
                )
        return value

    @model_validator(mode="after")
    def _amqp_tls_consistent(self) -> Self:
        problem = amqp_tls_problem(
            self.amqp_urls[0], self.amqp_ca_file, self.amqp_cert_file, self.amqp_key_file
        )
        if problem:
            raise ValueError(problem)
        return self

    @property
    def dlx(self) -> str:
        return f"{self.exchange}.dlx"

    @property
    def unroutable_exchange(self) -> str:
        """The alternate exchange of `exchange`: what no queue is bound for lands here."""
        return f"{self.exchange}.unroutable"

    @property
    def dead_letter_queue(self) -> str:
        return f"{self.queue_prefix}.dead_letters"

    def queue_name(self, route_name: str) -> str:
        return f"{self.queue_prefix}.{route_name}"

    @property
    def amqp_tls(self) -> bool:
        """Whether the broker is reached over TLS (an `amqps://` URL)."""
        return urlsplit(self.amqp_urls[0]).scheme.lower() == "amqps"

    @property
    def amqp_urls(self) -> list[str]:
        """The broker's nodes, in the order pkgq tries them (PKGQ_AMQP_URL)."""
        return split_urls(self.amqp_url)

    def safe_amqp_url(self) -> str:
        return mask_url(self.amqp_url)

    @property
    def amqp_user(self) -> str:
        """The RabbitMQ user pkgq connects as (AMQP's default, guest, when the URL names none;
        with `?auth=external`, the URL names the client certificate's common name): the user_id
        pkgq's messages carry, and the only one its lifecycle consumers trust."""
        from yarl import URL  # aio-pika's own URL parser, so both read the URL alike

        return URL(self.amqp_urls[0]).user or "guest"
