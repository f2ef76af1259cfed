"""Layer 2 of deploy/k8s/verify.sh's checks: the database's max_connections holds every pkgq
pod's pool."""

from __future__ import annotations

from typing import Any

from workloads import WORKLOADS, args_of, by_kind, pod_spec, settings_of

Doc = dict[str, Any]

PG_DEFAULT_MAX_CONNECTIONS = 100
PG_DEFAULT_SUPERUSER_RESERVED = 3
KEDA_DEFAULT_MAX_REPLICAS = 100


def _surge(doc: Doc, replicas: int) -> int:
    """Extra pods a Deployment's rolling update runs next to the old ones."""
    strategy = doc["spec"].get("strategy", {})
    if strategy.get("type") == "Recreate":
        return 0
    surge = strategy.get("rollingUpdate", {}).get("maxSurge", "25%")
    if isinstance(surge, str) and surge.endswith("%"):
        return -(-replicas * int(surge[:-1]) // 100)
    return int(surge)


def connection_errors(database: Doc, docs: list[Doc], pkgq: Doc) -> list[str]:
    """Every pkgq pod at its pool's maximum (plus the connection of its outage probe), with
    KEDA at its maximum and one rollout's surge, fits the server's max_connections less the
    superuser's reserve (otherwise: `too many clients`, an outage for every route)."""
    kinds = by_kind(docs)
    configmaps = kinds.get("ConfigMap", {})
    scaled = {
        d["spec"]["scaleTargetRef"]["name"]: d["spec"].get(
            "maxReplicaCount", KEDA_DEFAULT_MAX_REPLICAS
        )
        for d in kinds.get("ScaledObject", {}).values()
    }
    needed = 0
    parts: list[str] = []
    for kind in (*WORKLOADS, "Job"):
        for name, doc in sorted(kinds.get(kind, {}).items()):
            container = pod_spec(doc)["containers"][0]
            settings = settings_of(container, configmaps)
            if args_of(doc)[:1] == ["web"]:
                pool = int(settings.get("PKGQ_WEB_POOL_MAX_SIZE", pkgq["web_pool_max_size"]))
            elif args_of(doc)[:1] == ["migrate"]:
                pool = 2  # its database's connection and the one to `postgres`
            else:
                pool = int(settings.get("PKGQ_POOL_MAX_SIZE", pkgq["pool_max_size"]))
            if kind == "Job":
                pods = int(doc["spec"].get("parallelism", 1))
            else:
                pods = int(scaled.get(name, doc["spec"].get("replicas", 1)))
                if kind == "Deployment":
                    pods += _surge(doc, pods)
            needed += pods * (pool + 1)
            parts.append(f"{name} {pods}x{pool + 1}")
    params = database["spec"].get("postgresql", {}).get("parameters", {})
    limit = int(params.get("max_connections", PG_DEFAULT_MAX_CONNECTIONS))
    reserved = int(params.get("superuser_reserved_connections", PG_DEFAULT_SUPERUSER_RESERVED))
    reserved += int(params.get("reserved_connections", 0))
    if needed > limit - reserved:
        return [
            f"Cluster/{database['metadata']['name']}: max_connections {limit} (less {reserved} "
            f"reserved) cannot hold pkgq's {needed} connections: {', '.join(parts)}"
        ]
    return []
