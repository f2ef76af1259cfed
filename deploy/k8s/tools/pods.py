"""Layer 2 of deploy/k8s/verify.sh's checks, the pods: each one hardened (non-root, read-only,
no privilege escalation, all capabilities dropped, requests and limits, tagged images, probes on
the status port, a grace period longer than the drain), and least privilege as the manifests can
show it (the topology from the definitions, the owner's DSN in the migrate Job only, KEDA as the
autoscaler user)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from workloads import (
    WORKLOADS,
    containers,
    env_entry,
    image_tagged,
    pod_spec,
    secret_key,
    selects,
    settings_of,
)

Doc = dict[str, Any]
DEFAULT_DRAIN_TIMEOUT = 30.0
AUTOSCALER_KEY = "autoscaler-amqp-url"
MIGRATE_KEY = "migrate-dsn"


def pod_errors(doc: Doc, configmaps: dict[str, Doc], secret_ref: Callable[..., None]) -> list[str]:
    errors: list[str] = []
    where = f"{doc['kind']}/{doc['metadata']['name']}"
    pod = pod_spec(doc)
    pod_sc = pod.get("securityContext", {})
    if pod_sc.get("runAsNonRoot") is not True or not pod_sc.get("runAsUser"):
        errors.append(f"{where}: pod must set runAsNonRoot and a non-zero runAsUser")
    if pod_sc.get("seccompProfile", {}).get("type") != "RuntimeDefault":
        errors.append(f"{where}: pod seccompProfile must be RuntimeDefault")
    if pod.get("automountServiceAccountToken") is not False:
        errors.append(f"{where}: automountServiceAccountToken must be false")
    drain = DEFAULT_DRAIN_TIMEOUT
    for container in containers(doc):
        cwhere = f"{where} container {container['name']}"
        sc = container.get("securityContext", {})
        if sc.get("readOnlyRootFilesystem") is not True:
            errors.append(f"{cwhere}: readOnlyRootFilesystem must be true")
        if sc.get("allowPrivilegeEscalation") is not False:
            errors.append(f"{cwhere}: allowPrivilegeEscalation must be false")
        if sc.get("privileged"):
            errors.append(f"{cwhere}: must not be privileged")
        if "ALL" not in sc.get("capabilities", {}).get("drop", []):
            errors.append(f"{cwhere}: capabilities must drop ALL")
        resources = container.get("resources", {})
        for part in ("requests", "limits"):
            for resource in ("cpu", "memory"):
                if resource not in resources.get(part, {}):
                    errors.append(f"{cwhere}: no {part}.{resource}")
        if not image_tagged(container["image"]):
            errors.append(f"{cwhere}: image {container['image']!r} needs a tag, not latest")
        for source in container.get("envFrom", []):
            ref = source.get("configMapRef", {}).get("name")
            if ref is not None and ref not in configmaps:
                errors.append(f"{cwhere}: envFrom ConfigMap {ref!r} is not rendered")
            if "secretRef" in source:
                errors.append(f"{cwhere}: secrets go in env by key, not envFrom")
        for env in container.get("env", []):
            key_ref = env.get("valueFrom", {}).get("secretKeyRef")
            if key_ref:
                secret_ref(cwhere, key_ref["name"], key_ref["key"])
            elif env["name"] in ("PKGQ_POSTGRES_DSN", "PKGQ_AMQP_URL", "PKGQ_MIGRATE_DSN"):
                errors.append(f"{cwhere}: {env['name']} must come from the Secret")
        settings = settings_of(container, configmaps)
        drain = max(drain, float(settings.get("PKGQ_DRAIN_TIMEOUT", DEFAULT_DRAIN_TIMEOUT)))
        if doc["kind"] in WORKLOADS:
            errors += _status_port_errors(cwhere, container, settings)
    grace = pod.get("terminationGracePeriodSeconds", 30)
    if grace <= drain:
        errors.append(
            f"{where}: terminationGracePeriodSeconds {grace} must exceed the drain {drain}"
        )
    if doc["kind"] in WORKLOADS:
        labels = doc["spec"]["template"]["metadata"].get("labels", {})
        if not selects(doc["spec"]["selector"]["matchLabels"], labels):
            errors.append(f"{where}: selector does not match the pod template's labels")
    return errors


def _status_port_errors(cwhere: str, container: Doc, settings: dict[str, str]) -> list[str]:
    errors: list[str] = []
    port = int(settings.get("PKGQ_HTTP_PORT", "0"))
    # pkgq binds the status port to 127.0.0.1 unless told otherwise, out of the kubelet's
    # reach: its probes would fail and every pod would be restarted.
    if settings.get("PKGQ_HTTP_HOST") not in ("0.0.0.0", "::"):  # noqa: S104
        errors.append(f"{cwhere}: PKGQ_HTTP_HOST must be 0.0.0.0 for the probes")
    ports = {p.get("name"): p["containerPort"] for p in container.get("ports", [])}
    if not port or port not in ports.values():
        errors.append(f"{cwhere}: PKGQ_HTTP_PORT ({port}) is not a containerPort")
    for probe, path in (
        ("startupProbe", "/healthz"),
        ("livenessProbe", "/healthz"),
        ("readinessProbe", "/readyz"),
    ):
        get = container.get(probe, {}).get("httpGet", {})
        probe_port = ports.get(get.get("port"), get.get("port"))
        if get.get("path") != path or probe_port != port:
            errors.append(f"{cwhere}: {probe} must GET {path} on the status port")
    return errors


def privilege_errors(workloads: dict[str, Doc], kinds: dict[str, dict[str, Doc]]) -> list[str]:
    """Least privilege, as the manifests can show it."""
    errors: list[str] = []
    configmaps = kinds.get("ConfigMap", {})
    runtime_amqp_keys: set[str] = set()
    for name, doc in workloads.items():
        for container in containers(doc):
            where = f"{doc['kind']}/{name} container {container['name']}"
            if settings_of(container, configmaps).get("PKGQ_DECLARE_TOPOLOGY") != "false":
                errors.append(
                    f"{where}: PKGQ_DECLARE_TOPOLOGY must be false (the runtime user has no "
                    "configure permission; the topology comes from the definitions)"
                )
            if env_entry(container, "PKGQ_MIGRATE_DSN") is not None:
                errors.append(f"{where}: only the migrate Job connects as the owner")
            key = secret_key(container, "PKGQ_AMQP_URL")
            if key is not None:
                runtime_amqp_keys.add(key)
    for name, doc in kinds.get("Job", {}).items():
        for container in containers(doc):
            if secret_key(container, "PKGQ_MIGRATE_DSN") != MIGRATE_KEY:
                errors.append(
                    f"Job/{name}: PKGQ_MIGRATE_DSN must come from the Secret key {MIGRATE_KEY!r} "
                    "(the owner role migrates; the runtime role cannot)"
                )
    for name, doc in kinds.get("TriggerAuthentication", {}).items():
        for ref in doc["spec"].get("secretTargetRef", []):
            if ref["parameter"] == "host" and (
                ref["key"] != AUTOSCALER_KEY or ref["key"] in runtime_amqp_keys
            ):
                errors.append(
                    f"TriggerAuthentication/{name}: host must be the read-only autoscaler "
                    f"user's URL (Secret key {AUTOSCALER_KEY!r}), not the runtime's"
                )
    return errors
