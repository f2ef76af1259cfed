"""The dead-letter reasons page: every reason pkgq can file, what it means, and who files it;
`reasons_in_code` reads the code for the reasons it can file, so none goes undocumented."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from devtools.reference.common import HEADER, ROOT, SCANNED, table

REASONS: dict[str, tuple[str, str]] = {
    # reason: (who files it, what it means and what to do)
    "oversized": (
        "decoding",
        "The body is larger than PKGQ_MAX_BODY_BYTES. Never applied as sent; holds nothing.",
    ),
    "missing_message_id": (
        "decoding",
        "No AMQP message_id property: pkgq's idempotency key. Publish with one (a UUID).",
    ),
    "invalid_message_id": ("decoding", "The message_id is not a UUID."),
    "wrong_content_type": ("decoding", "The content_type is not application/json."),
    "unknown_type": ("decoding", "The AMQP type is not the route's message type."),
    "unsupported_version": (
        "decoding",
        "x-schema-version is neither the route's version, the one before, nor the next "
        "(the next is held for a newer pod instead: see Message versions).",
    ),
    "invalid_header": ("decoding", "A header pkgq reads is not of its type (e.g. not an integer)."),
    "invalid_utf8": ("decoding", "The body is not UTF-8."),
    "invalid_json": (
        "decoding",
        "The body is not JSON, or nests arrays and objects deeper than 64 (the depth is in the "
        "error).",
    ),
    "schema_invalid": (
        "decoding",
        "The JSON does not fit the route's model: an unknown field, a wrong type, a string for "
        "a number, text Postgres cannot store, or an x-user-id header that differs from the body.",
    ),
    "untrusted_publisher": (
        "decoding",
        "A lifecycle or internal message not published by pkgq (its AMQP user_id, or its first "
        "publisher in x-pkgq-publisher). Never replayed.",
    ),
    "domain_rule": (
        "the domain",
        "A broken domain rule (unknown package, someone else's item, a queue beyond "
        "PKGQ_MAX_QUEUED_ITEMS, ...): retrying cannot help. Holds nothing.",
    ),
    "data_error": (
        "Postgres",
        "A value Postgres refuses every time (SQLSTATE class 22, a not-null or check "
        "violation) that the domain's checks missed. Holds its user's later messages.",
    ),
    "max_attempts": (
        "the failure path",
        "A handler error on every attempt of the route's retry policy. Holds its user.",
    ),
    "unknown_version": (
        "the failure path",
        "A schema version newer than this pkgq knows, deferred `PKGQ_NEWER_VERSION_DEFERRALS` "
        "times (counted in Postgres) and still unknown. Holds its user; replay it once the "
        "pkgq that knows the version runs.",
    ),
    "ttr": (
        "the failure path",
        "The handler ran past the route's TTR on its last allowed attempt. Holds its user.",
    ),
    "handler_error": (
        "the consumer's last resort",
        "A handler error filed by the last-resort copy (the failure path itself failed).",
    ),
    "undecided": (
        "the consumer's last resort",
        "Not even the failure could be recorded: the consumer published a confirmed copy to "
        "the dead-letter exchange, and the ingester filed it.",
    ),
    "unroutable": (
        "the ingester",
        "A command no queue was bound for (a partitioned route's plain key, a stale partition "
        "map), caught by the exchange's alternate exchange. `pkgq dlq replay --error "
        "unroutable` sends it to its partition.",
    ),
    "rejected": ("the broker (x-death)", "Rejected without requeue by a consumer."),
    "expired": ("the broker (x-death)", "Its TTL ran out on a queue. Holds nothing."),
    "maxlen": ("the broker (x-death)", "Dropped by a queue's length limit."),
    "delivery_limit": (
        "the broker (x-death)",
        "A quorum queue handed it out PKGQ_DELIVERY_LIMIT times (see Replicated profile).",
    ),
    "unstorable": (
        "the ingester",
        "A dead letter whose body or headers cannot be stored as they are; kept in a safe form.",
    ),
    "unknown": ("the ingester", "A dead-lettered message with no reason the ingester can read."),
}
"""Every reason a dead letter may carry. `Bury("why")` from a handler adds its own text."""

NOT_REASONS = frozenset({"server_not_writable", "exited"})
"""String literals named `reason` in the code that are not dead-letter reasons (log fields)."""


def _reason_literals(tree: ast.AST) -> Iterator[str]:
    """String literals the code files as a reason: BadMessageError("r", ...), Bury-like
    `reason="r"`, `reason = "r"`, `kind, reason = K, "r"`, Decision(Fate.DEAD_LETTERED, "r"),
    and module constants assigned in ALL_CAPS from a reason-looking name (UNROUTABLE = ...)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            called = getattr(func, "id", None) or getattr(func, "attr", None)
            first = node.args[0] if node.args else None
            if called == "BadMessageError" and isinstance(first, ast.Constant):
                yield str(first.value)
            if called == "Decision" and len(node.args) > 1:
                second = node.args[1]
                if isinstance(second, ast.Constant) and isinstance(second.value, str):
                    yield second.value
            for kw in node.keywords:
                if kw.arg == "reason" and isinstance(kw.value, ast.Constant):
                    yield str(kw.value.value)
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                names = target.elts if isinstance(target, ast.Tuple) else [target]
                values = node.value.elts if isinstance(node.value, ast.Tuple) else [node.value]
                for name, value in zip(names, values, strict=False):
                    named = getattr(name, "id", "")
                    literal = isinstance(value, ast.Constant) and isinstance(value.value, str)
                    if literal and named in {"reason", "UNROUTABLE", "UNTRUSTED_PUBLISHER"}:
                        assert isinstance(value, ast.Constant)
                        yield str(value.value)


def reasons_in_code() -> set[str]:
    """Every reason the code can file, found by reading it (see _reason_literals), with the
    broker's (consumers/ingest.py BROKER_REASONS)."""
    from consumers.ingest import BROKER_REASONS

    found = set(BROKER_REASONS)
    for package in SCANNED:
        for path in sorted((ROOT / package).rglob("*.py")):
            found |= set(_reason_literals(ast.parse(path.read_text())))
    return found - NOT_REASONS


def dead_letters_page() -> str:
    rows = [(f"`{r}`", who, meaning) for r, (who, meaning) in sorted(REASONS.items())]
    return (
        "# Dead-letter reasons\n\n"
        + HEADER
        + "The `reason` of a dead letter (`pkgq dlq list`, the console), who files it, and what "
        'it means. A handler\'s `Bury("why")` files its own text. What to do with them: '
        "[replay and edit dead letters](../how-to/dead-letters.md).\n\n"
        + table(("reason", "filed by", "meaning"), rows)
    )
