"""The decode stage: raw deliveries become decoded ones, or bad input with its reason."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from uuid import UUID

from events.decoding import BadMessageError, Decoded, RawDelivery, decode
from events.routes import Route


@dataclass(frozen=True, slots=True)
class Delivery:
    """A delivery that decoded, and its place in the batch as the broker delivered it."""

    index: int
    raw: RawDelivery
    decoded: Decoded

    @property
    def message_id(self) -> UUID:
        return self.decoded.envelope.message_id

    @property
    def user_id(self) -> UUID | None:
        return self.decoded.envelope.user_id


@dataclass(frozen=True, slots=True)
class BadDelivery:
    index: int
    raw: RawDelivery
    problem: BadMessageError


def decode_all(
    route: Route, raws: Sequence[tuple[int, RawDelivery]], *, max_body_bytes: int
) -> tuple[list[Delivery], list[BadDelivery]]:
    """Decode (index, delivery) pairs. The good ones come back in the order they are applied
    in: user by user (in user_id order, the order their rows are locked in), each user's in
    delivery order."""
    ready: list[Delivery] = []
    bad: list[BadDelivery] = []
    for index, raw in raws:
        try:
            ready.append(Delivery(index, raw, decode(route, raw, max_body_bytes=max_body_bytes)))
        except BadMessageError as problem:
            bad.append(BadDelivery(index, raw, problem))
    ready.sort(key=lambda d: (str(d.user_id), d.index))
    return ready, bad
