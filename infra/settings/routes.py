"""The per-route settings (a routes file, or JSON), which win over the process-wide defaults
of the delivery and the replicated concerns."""

from __future__ import annotations

from typing import Any, Self

from pydantic import BaseModel, Field, field_validator, model_validator

from infra.route_config import RouteSettings, load_routes_file

NO_ROUTE_SETTINGS = RouteSettings()
"""What `Settings.route` gives for a route without settings of its own."""


def known_routes(value: dict[str, Any]) -> dict[str, Any]:
    """`value`, a dict by route name, if it names only routes there are; else ValueError."""
    from events.routes import ROUTES  # settings stay importable without the route table

    unknown = sorted(set(value) - set(ROUTES))
    if unknown:
        raise ValueError(f"unknown route(s) {unknown}; routes are {sorted(ROUTES)}")
    return value


class RouteTableSettings(BaseModel):
    """Per-route settings."""

    routes_file: str | None = None
    """A TOML file with per-route settings (concurrency, prefetch, batch_size, partitions, retry,
    ttr, queue_type), e.g. `[routes.usage_record]` then `concurrency = 4`. See RouteSettings and
    infra/route_config.py; values in it win over PKGQ_PARTITIONS and PKGQ_RETRY_ROUTES."""
    route_settings: dict[str, RouteSettings] = Field(default_factory=dict)
    """The per-route settings by full route name (filled from routes_file, or set as JSON)."""

    @field_validator("route_settings")
    @classmethod
    def _known_routes(cls, value: dict[str, Any]) -> dict[str, Any]:
        return known_routes(value)

    @model_validator(mode="after")
    def _read_routes_file(self) -> Self:
        if self.routes_file and not self.route_settings:
            self.route_settings = load_routes_file(self.routes_file)
        return self

    def route(self, route_name: str) -> RouteSettings:
        """The route's own settings; one shared empty RouteSettings (frozen) for a route that
        has none, as the relay asks for every row it publishes."""
        return self.route_settings.get(route_name) or NO_ROUTE_SETTINGS
