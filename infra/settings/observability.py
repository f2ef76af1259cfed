"""What a process shows of itself: its status port (/metrics, /healthz, /readyz) and its logs."""

from __future__ import annotations

from pydantic import BaseModel, Field


class ObservabilitySettings(BaseModel):
    """Observability: the status port and the logs."""

    http_port: int = Field(default=0, ge=0, le=65535)
    """/metrics, /healthz and /readyz of this process (infra/observability.py); 0: off."""
    http_host: str = "127.0.0.1"
    """The status port's bind address: loopback unless a deployment says otherwise (the k8s
    manifests set 0.0.0.0, for the kubelet's probes and the scraper)."""
    metrics_refresh_interval: float = Field(default=10.0, gt=0)
    """How often the outbox backlog and dead-letter gauges are read from Postgres."""

    critical_p99_objective_s: float = Field(default=30.0, gt=0)
    """The objective for the p99 of the time a user waits (pkgq_critical_seconds: from a
    message's first publication to its commit). Exported as pkgq_critical_p99_objective_seconds,
    which the PkgqCriticalTimeOverObjective alert compares each route's p99 with."""

    log_format: str = Field(default="auto", pattern="^(auto|json|console)$")
    log_level: str = "info"
