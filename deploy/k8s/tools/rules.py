"""Layer 2 of deploy/k8s/verify.sh's checks: pkgq's own rules over an overlay's documents
(`rule_errors` here, with the pods' own rules in pods.py; `replication_errors` in replication.py).

- Pods: non-root, read-only, no privilege escalation, all capabilities dropped, requests and
  limits, tagged images, probes on the status port, a grace period longer than the drain.
- Least privilege: every long-running pod has PKGQ_DECLARE_TOPOLOGY=false (the topology comes
  from the definitions); the migrate Job connects with PKGQ_MIGRATE_DSN (the owner) and no
  other process does; KEDA authenticates as the autoscaler user, with a Secret key no pod uses.
- Routes: one workload per route running `pkgq run ROUTE --no-ingest`: a plain route a
  Deployment with a fixed count; a partitioned route an elastic Deployment or StatefulSet (its
  pods share the partitions; 1..P pods, a fixed count or KEDA's) or a pinned StatefulSet
  (replica I of PKGQ_REPLICA_COUNT from the pod ordinal), scaling.py says which exactly; the
  ConfigMap's PKGQ_PARTITIONS is the definitions' partition map. The relay, the dead-letter
  ingester and migrate run once each.
- Autoscaling only where pods add throughput (scaling.py): a ScaledObject may target a workload
  that consumes a queue that is not single-active-consumer (the dead-letter ingester), or a
  partitioned route's elastic workload, on its partition queues, 1..P pods.
- References resolve: ConfigMaps, the Secret's keys, PodDisruptionBudgets (one per workload,
  and one per RabbitmqCluster, whose operator makes none), the TriggerAuthentication.
- Replicated services (replication.py, for prod): one RabbitmqCluster of 3+ nodes, one
  per machine, pause_minority, with deploy/rabbitmq/rabbitmq.conf's settings; one CloudNativePG
  Cluster of 3+ instances, one per machine, synchronous (durability required, failover quorum),
  pkgq's database and owner, max_connections for every pod's pool (connections.py);
  PKGQ_QUEUE_TYPE=quorum.
"""

from __future__ import annotations

import json
from typing import Any

from pods import pod_errors, privilege_errors
from replication import operator_pods
from scaling import keda_errors, partitioned_errors, route_run, scaled_targets
from workloads import (
    SECRET_NAME,
    WORKLOADS,
    args_of,
    by_kind,
    containers,
    pod_spec,
    selects,
    settings_of,
)

Doc = dict[str, Any]


def rule_errors(
    docs: list[Doc], routes: dict[str, list[str]], shared_queues: set[str]
) -> list[str]:
    """`routes`: route -> its queues in the definitions (one, or its partition queues);
    `shared_queues`: the queues that are not single-active-consumer."""
    kinds = by_kind(docs)
    errors: list[str] = []
    secret_keys: set[str] = set()

    def secret_ref(where: str, name: str, key: str) -> None:
        if name != SECRET_NAME:
            errors.append(f"{where}: secret {name!r}, expected {SECRET_NAME!r}")
        secret_keys.add(key)

    workloads = {n: d for k in WORKLOADS for n, d in kinds.get(k, {}).items()}
    for doc in [*workloads.values(), *kinds.get("Job", {}).values()]:
        errors += pod_errors(doc, kinds.get("ConfigMap", {}), secret_ref)
    errors += privilege_errors(workloads, kinds)
    for name, doc in kinds.get("TriggerAuthentication", {}).items():
        for ref in doc["spec"].get("secretTargetRef", []):
            secret_ref(f"TriggerAuthentication/{name}", ref["name"], ref["key"])
    secrets = kinds.get("Secret", {})
    if secrets:
        data = {**secrets.get(SECRET_NAME, {}).get("data", {})}
        data.update(secrets.get(SECRET_NAME, {}).get("stringData", {}))
        for key in sorted(secret_keys - set(data)):
            errors.append(f"Secret/{SECRET_NAME}: no key {key!r}, which is referenced")
    errors += pdb_errors(workloads, kinds.get("PodDisruptionBudget", {}), operator_pods(docs))
    errors += keda_errors(workloads, kinds, shared_queues, routes)
    errors += route_errors(workloads, kinds, routes)
    return errors


def pdb_errors(
    workloads: dict[str, Doc], pdbs: dict[str, Doc], operated: dict[str, dict[str, str]]
) -> list[str]:
    """One PDB per workload, and per custom resource whose operator makes none (`operated`:
    its pods' labels by "Kind/name")."""
    errors: list[str] = []
    pods = {
        **{
            f"{d['kind']}/{w}": d["spec"]["template"]["metadata"]["labels"]
            for w, d in workloads.items()
        },
        **operated,
    }
    covered: set[str] = set()
    for name, doc in pdbs.items():
        selector = doc["spec"]["selector"]["matchLabels"]
        matched = [owner for owner, labels in pods.items() if selects(selector, labels)]
        covered.update(matched)
        if len(matched) != 1:
            errors.append(f"PodDisruptionBudget/{name}: selects {len(matched)} workloads")
    for owner in sorted(set(pods) - covered):
        errors.append(f"{owner}: no PodDisruptionBudget")
    return errors


def route_errors(
    workloads: dict[str, Doc], kinds: dict[str, dict[str, Doc]], routes: dict[str, list[str]]
) -> list[str]:
    errors: list[str] = []
    configmaps = kinds.get("ConfigMap", {})
    scaled = scaled_targets(kinds)
    runners: dict[str, list[Doc]] = {}
    for doc in workloads.values():
        route = route_run(doc)
        if route is not None:
            runners.setdefault(route, []).append(doc)
    for route in sorted(set(runners) - set(routes)):
        errors.append(
            f"{route}: run by {[d['metadata']['name'] for d in runners[route]]}, "
            "but the definitions have no queue for it"
        )
    for route, queues in sorted(routes.items()):
        partitions = len(queues)
        found = runners.get(route, [])
        kinds_found = [d["kind"] for d in found]
        wanted = ["Deployment"] if partitions == 1 else ["Deployment", "StatefulSet"]
        if len(found) != 1 or kinds_found[0] not in wanted:
            errors.append(
                f"{route} ({partitions} partition(s)): needs exactly one "
                f"{' or '.join(wanted)} running "
                f"`pkgq run {route.removeprefix('telecom.')} --no-ingest`, found "
                f"{[d['kind'] + '/' + d['metadata']['name'] for d in found]}"
                + ("" if found else f": no consumer for {queues}")
            )
            continue
        doc = found[0]
        container = pod_spec(doc)["containers"][0]
        settings = settings_of(container, configmaps)
        mapped = json.loads(settings.get("PKGQ_PARTITIONS", "{}")).get(route, 1)
        if mapped != partitions:
            errors.append(
                f"{route}: PKGQ_PARTITIONS says {mapped} partition(s), the definitions have "
                f"{partitions} queue(s): regenerate deploy/k8s/rabbitmq-definitions.json"
            )
        if partitions > 1:
            on = (doc["kind"], doc["metadata"]["name"]) in scaled
            errors += partitioned_errors(doc, configmaps, partitions, on)
    for needed in (["relay"], ["dlq", "ingest"]):
        if sum(1 for d in workloads.values() if args_of(d) == needed) != 1:
            errors.append(f"need exactly one workload running `pkgq {' '.join(needed)}`")
    migrate = [n for n, d in kinds.get("Job", {}).items() if args_of(d) == ["migrate"]]
    if len(migrate) != 1:
        errors.append("need exactly one Job running `pkgq migrate`")
    return errors


def commands(docs: list[Doc]) -> set[tuple[str, ...]]:
    """The distinct `pkgq ...` command lines the manifests run (verify.sh asks pkgq about them)."""
    out: set[tuple[str, ...]] = set()
    for doc in docs:
        if doc["kind"] in (*WORKLOADS, "Job"):
            for container in containers(doc):
                out.add((*container.get("command", []), *container.get("args", [])))
    return out
