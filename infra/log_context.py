"""The delivery a log line is written under: its route, message, user and trace, added to the
line only when one is written.

The executor decides and applies each delivery of a batch in turn; whatever is logged meanwhile
(a handler's warning, the domain's refusal) names that delivery. Binding the four fields as
structlog context variables for every delivery cost a few microseconds each, whether or not
anything was logged (at log level warning almost nothing is): here one context variable holds
the delivery, and `add_delivery` (a structlog processor) works the fields out for the lines
actually written. A field the call site gives itself wins.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from contextvars import ContextVar, Token
from typing import Any

from domain.records import record
from events.envelope import Envelope, trace_id_of


@record
class DeliveryContext:
    route: str
    envelope: Envelope


_current: ContextVar[DeliveryContext | None] = ContextVar("pkgq_delivery", default=None)


def enter(route: str, envelope: Envelope) -> Token[DeliveryContext | None]:
    """Log lines from here on name this delivery (until `leave` with the token)."""
    return _current.set(DeliveryContext(route, envelope))


def leave(token: Token[DeliveryContext | None]) -> None:
    _current.reset(token)


def add_delivery(_logger: object, _method: str, event: MutableMapping[str, Any]) -> Any:
    """The structlog processor: the current delivery's route, message_id, user_id, trace_id."""
    current = _current.get()
    if current is None:
        return event
    envelope = current.envelope
    event.setdefault("route", current.route)
    event.setdefault("message_id", str(envelope.message_id))
    event.setdefault("user_id", str(envelope.user_id) if envelope.user_id else None)
    event.setdefault("trace_id", trace_id_of(envelope.traceparent))
    return event
