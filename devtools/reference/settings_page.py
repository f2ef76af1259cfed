"""The settings page: every `PKGQ_*` setting, read from the pydantic settings and the docstring
under each field."""

from __future__ import annotations

import ast
import inspect
import textwrap
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from devtools.reference.common import HEADER, code, one_line, table

UNDOCUMENTED = {
    # What the README's settings table said of the fields that have no docstring (yet): used
    # only while a field has none, so a docstring added to the field wins.
    "tcp_keepalives_interval": "Seconds between the server's probes of a silent client "
    "connection (see PKGQ_TCP_KEEPALIVES_IDLE).",
    "tcp_keepalives_count": "Unanswered probes before the server drops a silent client "
    "connection (see PKGQ_TCP_KEEPALIVES_IDLE).",
    "max_body_bytes": "The largest message body pkgq accepts; a bigger one is buried as "
    "`oversized`. The broker's max_message_size (deploy/rabbitmq/rabbitmq.conf) matches it.",
    "pool_min_size": "Postgres connections per process, at least (raise the maximum with "
    "`--concurrency`).",
    "pool_max_size": "Postgres connections per process, at most.",
    "relay_batch_size": "Outbox rows the relay claims and publishes in one round.",
    "relay_poll_interval": "Seconds between the relay's polls when no NOTIFY wakes it.",
    "drain_timeout": "Seconds `pkgq run` and `pkgq relay` take to drain on SIGTERM/SIGINT, "
    "even while RabbitMQ is down.",
    "log_format": "`auto` (JSON off a TTY, readable on one), `json` or `console`.",
    "log_level": "The lowest level logged: `debug`, `info`, `warning`, `error`.",
    "standby_delay": "Seconds a `pkgq run` replica waits before it subscribes to the "
    "partitions it stands by for (see PKGQ_REPLICA).",
    "prune_batch_size": "Rows retention deletes in one statement (see PKGQ_RETENTION).",
    "host": "The address `pkgq web` (the console and the read API) listens on.",
    "port": "The port `pkgq web` listens on.",
    "access_log": "Whether uvicorn writes its access log.",
}


def attribute_docstrings(model: type[BaseModel]) -> dict[str, str]:
    """The docstring under each field of `model` and its bases (PEP 257 attribute docstrings)."""
    found: dict[str, str] = {}
    for cls in reversed(model.__mro__):
        if cls is BaseModel or not issubclass(cls, BaseModel):
            continue
        try:
            source = textwrap.dedent(inspect.getsource(cls))
        except (OSError, TypeError):
            continue
        body = ast.parse(source).body[0]
        assert isinstance(body, ast.ClassDef)
        for node, after in zip(body.body, body.body[1:], strict=False):
            if (
                isinstance(node, ast.AnnAssign)
                and isinstance(node.target, ast.Name)
                and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)
            ):
                found[node.target.id] = inspect.cleandoc(after.value.value)
    return found


def type_name(annotation: Any) -> str:
    text = getattr(annotation, "__name__", None) if isinstance(annotation, type) else None
    text = text or str(annotation).replace("typing.", "")
    for module in ("infra.route_config.", "consumers.web.config.", "ipaddress."):
        text = text.replace(module, "")
    return text.replace("NoneType", "None")


def _default(field: FieldInfo) -> str:
    if field.default_factory is not None:
        value: Any = field.default_factory()  # type: ignore[call-arg]
    elif field.default is PydanticUndefined:
        return "required"
    else:
        value = field.default
    if value is None:
        return "unset"
    if isinstance(value, BaseModel):
        return code(value.model_dump_json())
    return code(repr(value) if isinstance(value, str) and not value else str(value))


def _bounds(field: FieldInfo) -> str:
    signs = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<", "max_length": "length <="}
    parts = [
        f"{sign} {getattr(m, attr)}"
        for m in field.metadata
        for attr, sign in signs.items()
        if getattr(m, attr, None) is not None
    ]
    return ", ".join(parts)


def settings_page() -> str:
    from consumers.web.config import WebSettings
    from infra.settings import Settings

    out = [
        "# Settings\n\n",
        HEADER,
        "Every setting is an environment variable; the defaults point at the local services. "
        "Under systemd a setting may also come from a credential file of the same name in "
        "lower case (`pkgq_postgres_dsn`), under Kubernetes from a Secret. Nested values "
        "(dicts, lists) are JSON.\n\n",
    ]
    for model, source in (
        (Settings, "infra/settings/ `Settings`"),
        (WebSettings, "consumers/web/config.py `WebSettings`: `pkgq web` only"),
    ):
        prefix = str(model.model_config.get("env_prefix", ""))
        docs = attribute_docstrings(model)
        out.append(f"## From {source}\n\n")
        for title, names in _concerns(model):
            if title:
                out.append(f"### {title}\n\n")
            rows = []
            for name in names:
                field = model.model_fields[name]
                meaning = one_line(docs.get(name) or field.description or UNDOCUMENTED.get(name))
                meaning = meaning or "(no docstring yet)"
                bounds = _bounds(field)
                rows.append(
                    (
                        f"`{prefix}{name.upper()}`",
                        code(type_name(field.annotation)),
                        _default(field),
                        meaning + (f" ({bounds})" if bounds else ""),
                    )
                )
            out.append(table(("variable", "type", "default", "meaning"), rows) + "\n")
    return "".join(out).rstrip() + "\n"


def _concerns(model: type[BaseModel]) -> list[tuple[str, list[str]]]:
    """The model's fields grouped by the concern (a base model of its own) that declares them,
    in the model's method resolution order, each titled by its class docstring's first line and
    its module; the fields the model declares itself come untitled."""
    groups: list[tuple[str, list[str]]] = []
    seen: set[str] = set()
    for cls in model.__mro__:
        if cls is BaseModel or not issubclass(cls, BaseModel):
            continue
        declared = inspect.get_annotations(cls)
        names = [n for n in declared if n in model.model_fields and n not in seen]
        seen.update(names)
        if names and cls is model:
            groups.append(("", names))
        elif names:
            doc = inspect.cleandoc(cls.__doc__ or cls.__name__).split("\n")[0].rstrip(".")
            module = cls.__module__.replace(".", "/") + ".py"
            groups.append((f"{doc} ({module} `{cls.__name__}`)", names))
    return groups
