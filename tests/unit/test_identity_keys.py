"""A message's key and what a dead letter's headers only claim (events/identity.py)."""

from __future__ import annotations

from uuid import UUID, uuid4

from hypothesis import given
from hypothesis import strategies as st

from events.envelope import H_USER_ID
from events.identity import body_user, claimed_user, message_key


@given(st.uuids(), st.one_of(st.none(), st.text(max_size=20)), st.one_of(st.none(), st.uuids()))
def test_a_key_changes_with_each_part_of_a_messages_identity(
    message_id: UUID, publisher: str | None, user: UUID | None
) -> None:
    key = message_key(message_id, publisher, user)
    assert key == message_key(message_id, publisher, user)
    assert key != message_key(uuid4(), publisher, user)
    assert key != message_key(message_id, f"{publisher}x", user)
    assert key != message_key(message_id, publisher, uuid4())


def test_nobody_and_unverified_are_one_publisher_and_no_user_is_not_a_user() -> None:
    m, u = uuid4(), uuid4()
    assert message_key(m, None, u) == message_key(m, "unverified", u)
    assert message_key(m, "shop", None) != message_key(m, "shop", u)


def test_the_user_of_a_body_that_did_not_decode_is_its_json_user_id_or_none() -> None:
    user = uuid4()
    assert body_user(f'{{"user_id": "{user}", "amount": "x"}}'.encode()) == user
    assert body_user(b'{"user_id": 7}') is None
    assert body_user(b'{"user_id": "not a uuid"}') is None
    assert body_user(b"[1, 2]") is None
    assert body_user(b"not json") is None
    assert body_user(b"[" * 5000) is None  # deeper than the bound: read as nothing


def test_a_user_header_is_shown_as_a_claim_unless_it_names_the_user_filed() -> None:
    user, other = uuid4(), uuid4()
    assert claimed_user({H_USER_ID: str(other)}, None) == str(other)
    assert claimed_user({H_USER_ID: str(other)}, user) == str(other)
    assert claimed_user({H_USER_ID: str(user)}, user) is None
    assert claimed_user({}, None) is None
    assert claimed_user({H_USER_ID: {"nested": 1}}, None) is None  # not text: nothing claimed
