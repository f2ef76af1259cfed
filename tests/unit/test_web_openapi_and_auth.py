"""The read API's committed OpenAPI document stays current, and the console's credentials work
as documented: scrypt password hashes, sha256-stored bearer tokens, settings that refuse to
start without a secret or anyone to sign in."""

from __future__ import annotations

import json
from pathlib import Path

from consumers.cli.web import openapi_document
from consumers.web.auth import hash_password, new_token, verify_password
from consumers.web.config import WebSettings

COMMITTED = Path(__file__).resolve().parents[2] / "docs" / "openapi.json"


def test_the_committed_openapi_document_is_current() -> None:
    assert json.loads(COMMITTED.read_text()) == json.loads(json.dumps(openapi_document())), (
        "docs/openapi.json is stale: regenerate it with `pkgq web openapi > docs/openapi.json`"
    )


def test_the_openapi_document_has_the_three_reads_with_their_errors() -> None:
    paths = openapi_document()["paths"]
    assert set(paths) == {
        "/api/v1/users/{user_id}/current",
        "/api/v1/users/{user_id}/packages",
        "/api/v1/users/{user_id}/access",
    }
    for path in paths.values():
        assert set(path) == {"get"}
        assert {"200", "401", "404", "422"} <= set(path["get"]["responses"])


def test_a_password_hash_verifies_its_password_only() -> None:
    stored = hash_password("correct horse", log_n=10)
    assert stored.startswith("scrypt$10$8$1$")
    assert verify_password("correct horse", stored)
    assert not verify_password("correct horse!", stored)
    assert hash_password("correct horse", log_n=10) != stored  # salted


def test_a_malformed_or_foreign_hash_verifies_nothing() -> None:
    for stored in ["", "plain-text", "bcrypt$2b$12$abc", "scrypt$40$8$1$AA==$AA==", "scrypt$x"]:
        assert not verify_password("anything", stored)


def test_a_new_token_comes_with_its_sha256() -> None:
    import hashlib

    token, digest = new_token()
    assert len(token) >= 40
    assert hashlib.sha256(token.encode()).hexdigest() == digest


def test_settings_without_a_secret_or_users_say_why_the_console_cannot_start() -> None:
    problems = WebSettings().problems()
    assert any("PKGQ_WEB_SECRET" in p for p in problems)
    assert any("hash-password" in p for p in problems)
    assert WebSettings(secret="x" * 32, tokens={}).problems() != []
