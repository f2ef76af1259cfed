"""Layer 2 of deploy/k8s/verify.sh's checks: pkgq's own rules over an overlay's documents
(`rule_errors` here, with the pods' own rules in pods.py; `replication_errors` in replication.py).

- Pods: non-root, read-only, no privilege escalation, all capabilities dropped, requests and
  limits, tagged images, probes on the status port, a grace period longer than the drain.
- Least privilege: every long-running pod has PKGQ_DECLARE_TOPOLOGY=false (the topology comes
  from the definitions); the migrate Job connects with PKGQ_MIGRATE_DSN (the owner) and no
  other process does; KEDA authenticates as the autoscaler user, with a Secret key no pod uses.
- Routes: a plain route is one Deployment with a fixed count running `pkgq run ROUTE`; a
  partitioned route is one StatefulSet whose `replicas` is its PKGQ_REPLICA_COUNT (at most the
  partition count), its index from the pod-index label; the ConfigMap's PKGQ_PARTITIONS is the
  definitions' partition map. The relay, the dead-letter ingester and migrate run once each.
- Autoscaling only where pods add throughput: a ScaledObject may target only a Deployment that
  consumes a queue that is not single-active-consumer (the dead-letter ingester).
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
from workloads import (
    POD_INDEX,
    SECRET_NAME,
    WORKLOADS,
    args_of,
    by_kind,
    containers,
    env_entry,
    pod_spec,
    selects,
    settings_of,
)

Doc = dict[str, Any]


def rule_errors(docs: list[Doc], routes: dict[str, int], shared_queues: set[str]) -> list[str]:
    """`routes`: route -> partition count, from the definitions; `shared_queues`: the queues
    that are not single-active-consumer."""
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
    errors += keda_errors(workloads, kinds, shared_queues)
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


def keda_errors(
    workloads: dict[str, Doc], kinds: dict[str, dict[str, Doc]], shared_queues: set[str]
) -> list[str]:
    errors: list[str] = []
    auths = kinds.get("TriggerAuthentication", {})
    deployments = kinds.get("Deployment", {})
    for name, doc in kinds.get("ScaledObject", {}).items():
        spec = doc["spec"]
        target = spec["scaleTargetRef"]
        scaled = deployments.get(target["name"])
        if target.get("kind", "Deployment") != "Deployment" or scaled is None:
            errors.append(f"ScaledObject/{name}: target {target['name']!r} is not a Deployment")
        elif args_of(scaled)[:1] == ["run"]:
            errors.append(
                f"ScaledObject/{name}: scales {target['name']}, a route consumer: its queues are "
                "single-active-consumer, where an added pod only stands by"
            )
        elif scaled["spec"].get("replicas") is not None:
            errors.append(f"Deployment/{target['name']}: sets replicas, but KEDA scales it")
        for trigger in spec["triggers"]:
            meta = trigger["metadata"]
            if trigger["type"] != "rabbitmq" or meta.get("mode") != "QueueLength":
                errors.append(f"ScaledObject/{name}: trigger must be rabbitmq, mode QueueLength")
            if "host" in meta or "hostFromEnv" in meta:
                errors.append(f"ScaledObject/{name}: the broker URL belongs in the auth ref")
            if meta.get("queueName") not in shared_queues:
                errors.append(
                    f"ScaledObject/{name}: trigger on {meta.get('queueName')!r}, not a queue "
                    f"whose consumers share the work ({sorted(shared_queues)})"
                )
            auth = trigger.get("authenticationRef", {})
            if auth.get("kind", "TriggerAuthentication") != "TriggerAuthentication" or (
                auth.get("name") not in auths
            ):
                errors.append(f"ScaledObject/{name}: authenticationRef does not resolve")
        if spec.get("minReplicaCount", 0) < 1:
            errors.append(f"ScaledObject/{name}: minReplicaCount must keep a consumer running")
    scaled_names = {
        d["spec"]["scaleTargetRef"]["name"] for d in kinds.get("ScaledObject", {}).values()
    }
    for name, doc in workloads.items():
        replicas = doc["spec"].get("replicas")
        fixed = isinstance(replicas, int) and replicas >= 1
        if doc["kind"] == "Deployment" and name not in scaled_names and not fixed:
            errors.append(f"Deployment/{name}: not autoscaled, so it must set replicas >= 1")
    return errors


def route_errors(
    workloads: dict[str, Doc], kinds: dict[str, dict[str, Doc]], routes: dict[str, int]
) -> list[str]:
    errors: list[str] = []
    configmaps = kinds.get("ConfigMap", {})
    runners: dict[str, list[Doc]] = {}
    for doc in workloads.values():
        args = args_of(doc)
        if args[:1] == ["run"] and len(args) == 3 and args[2] == "--no-ingest":
            runners.setdefault(f"telecom.{args[1]}", []).append(doc)
    for route in sorted(set(runners) - set(routes)):
        errors.append(
            f"{route}: run by {[d['metadata']['name'] for d in runners[route]]}, "
            "but the definitions have no queue for it"
        )
    for route, partitions in sorted(routes.items()):
        found = runners.get(route, [])
        want = "StatefulSet" if partitions > 1 else "Deployment"
        if [d["kind"] for d in found] != [want]:
            errors.append(
                f"{route} ({partitions} partition(s)): needs exactly one {want} running "
                f"`pkgq run {route.removeprefix('telecom.')} --no-ingest`, found "
                f"{[d['kind'] + '/' + d['metadata']['name'] for d in found]}"
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
        if want == "StatefulSet":
            errors += _replica_errors(doc, container, settings, partitions)
    for needed in (["relay"], ["dlq", "ingest"]):
        if sum(1 for d in workloads.values() if args_of(d) == needed) != 1:
            errors.append(f"need exactly one workload running `pkgq {' '.join(needed)}`")
    migrate = [n for n, d in kinds.get("Job", {}).items() if args_of(d) == ["migrate"]]
    if len(migrate) != 1:
        errors.append("need exactly one Job running `pkgq migrate`")
    return errors


def _replica_errors(
    doc: Doc, container: Doc, settings: dict[str, str], partitions: int
) -> list[str]:
    errors: list[str] = []
    where = f"StatefulSet/{doc['metadata']['name']}"
    replicas = doc["spec"].get("replicas")
    if settings.get("PKGQ_REPLICA_COUNT") != str(replicas):
        errors.append(
            f"{where}: PKGQ_REPLICA_COUNT {settings.get('PKGQ_REPLICA_COUNT')!r} must equal "
            f"replicas {replicas} (pod I is replica I of that count)"
        )
    if not isinstance(replicas, int) or not 1 <= replicas <= partitions:
        errors.append(f"{where}: replicas {replicas} must be 1..{partitions} (the partitions)")
    index = env_entry(container, "PKGQ_REPLICA_INDEX") or {}
    if index.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") != POD_INDEX:
        errors.append(f"{where}: PKGQ_REPLICA_INDEX must come from {POD_INDEX}")
    if doc["spec"].get("podManagementPolicy") != "Parallel":
        errors.append(f"{where}: podManagementPolicy must be Parallel (all take their own first)")
    return errors


def commands(docs: list[Doc]) -> set[tuple[str, ...]]:
    """The distinct `pkgq ...` command lines the manifests run (verify.sh asks pkgq about them)."""
    out: set[tuple[str, ...]] = set()
    for doc in docs:
        if doc["kind"] in (*WORKLOADS, "Job"):
            for container in containers(doc):
                out.add((*container.get("command", []), *container.get("args", [])))
    return out
