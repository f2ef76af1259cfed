"""The metrics page (the prometheus registry, once every module is imported) and the routes page
(the route table of events/routes.py)."""

from __future__ import annotations

from devtools.reference.common import HEADER, import_everything, one_line, table


def metrics_page() -> str:
    from prometheus_client import REGISTRY

    import_everything()
    collectors = set(REGISTRY._names_to_collectors.values())  # no public listing of them
    rows = []
    for collector in collectors:
        name = getattr(collector, "_name", None)
        if not isinstance(name, str) or not name.startswith("pkgq_"):
            continue  # the client's own process and platform collectors
        kind = str(getattr(collector, "_type", "?"))
        if kind == "counter":
            name += "_total"
        labels = ", ".join(f"`{label}`" for label in getattr(collector, "_labelnames", ()))
        rows.append((f"`{name}`", kind, labels, one_line(getattr(collector, "_documentation", ""))))
    return (
        "# Metrics\n\n"
        + HEADER
        + "Every process with `PKGQ_HTTP_PORT` set serves them on `/metrics` (Prometheus text). "
        "What to do when one moves: [read the dashboards at 3 a.m.](../how-to/dashboards.md).\n\n"
        + table(("metric", "type", "labels", "meaning"), sorted(rows))
    )


def routes_page() -> str:
    from events.routes import ALL_ROUTES, ROUTES

    rows = []
    for route in ALL_ROUTES.values():
        if route.name not in ROUTES:
            who, consumed = "pkgq", "no (for outside subscribers)"
        else:
            who, consumed = ("anyone allowed" if route.inbound else "pkgq only"), "yes"
        fields = ", ".join(
            f"`{name}`" + ("" if f.is_required() else "?")
            for name, f in route.model.model_fields.items()
        )
        versions = ", ".join(str(v) for v in route.accepted_versions)
        rows.append(
            (
                f"`{route.name}`",
                f"`{route.short_name}`",
                f"`{route.message_type}`",
                versions,
                who,
                consumed,
                fields,
            )
        )
    return (
        "# Routes\n\n"
        + HEADER
        + "The route table, `events/routes.py`: the routing key on the `telecom` exchange, the "
        "AMQP `type`, the `x-schema-version`s a consumer accepts, who may publish, and the body's "
        "fields (`?`: optional). Each consumed route has the queue `pkgq.<route>`. The full "
        "schemas: [the AsyncAPI document](../asyncapi.json) (`pkgq asyncapi`).\n\n"
        + table(
            ("route", "short", "type", "versions", "published by", "consumed", "body"),
            rows,
        )
    )
