"""A message's identity: what the broker and the body vouch for, never what it says of itself.

A delivery is the message (consumer, message_id, first publisher, user) where the first
publisher is the AMQP user_id the broker validated (kept across pkgq's own copies of it: retries,
replays, parked copies, in `x-pkgq-publisher`, believed from pkgq only; `unverified` without
one) and the user is the one its *body* names (`body_user` for bad input; None when it names
none). Two
deliveries under one message_id from two publishers, or for two users, are two messages.

Every piece of pkgq's bookkeeping about a message (the inbox, attempt counts, TTR strikes, a
hold's blocker, parked copies, a pending retry's cancel key, a dead letter) is matched on the
key `message_key` derives from that identity, never on the message_id alone: anyone can publish
under a message_id they know. The consumer is not in the key; every table that keeps one has a
consumer column beside it. PostgreSQL computes the same key (`telecom.message_key`, migration
0022), so rows written before it could be given theirs.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any
from uuid import UUID

from events import bounded_json
from events.envelope import H_USER_ID, UNVERIFIED, header_text


def message_key(message_id: UUID, publisher: str | None, user_id: UUID | None) -> UUID:
    """The key of the message `message_id` first published by `publisher` (None: nobody
    vouched for it) for `user_id` (None: no user)."""
    who = UNVERIFIED if publisher is None else publisher
    user = "" if user_id is None else user_id.hex
    digest = hashlib.md5(f"{message_id.hex}|{who}|{user}".encode(), usedforsecurity=False)
    return UUID(bytes=digest.digest())


def body_user(body: bytes) -> UUID | None:
    """The user a body names (its top-level `user_id`), for a message that did not decode: None
    unless the body is a JSON object (within the depth bound) with a UUID there. Never a header:
    `x-user-id` is only a claim beside the body."""
    try:
        parsed = bounded_json.loads(body)
    except (ValueError, RecursionError):
        return None
    named = parsed.get("user_id") if isinstance(parsed, dict) else None
    try:
        return UUID(named) if isinstance(named, str) else None
    except ValueError:
        return None


def claimed_user(headers: Mapping[str, Any], user_id: UUID | None) -> str | None:
    """The user a message's `x-user-id` header claims, when it is not the user the message is
    filed under (shown as a claim, never believed); None when it claims none or the same."""
    claimed = header_text(headers, H_USER_ID, 64)
    if claimed is None or claimed == (str(user_id) if user_id is not None else None):
        return None
    return claimed
