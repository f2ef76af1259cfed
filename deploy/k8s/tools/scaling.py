"""Layer 2 of deploy/k8s/verify.sh's checks: how many pods consume a route, and where KEDA may
change that number.

Every route queue, plain or partition, is single-active-consumer: one subscriber consumes it,
the others stand by. So:

- A plain route is one Deployment with a fixed count (rules.py): a pod added to it only stands
  by, and no ScaledObject may scale it.
- A partitioned route (P partition queues) is one workload of `pkgq run ROUTE --no-ingest`
  pods, either
  - elastic: a Deployment (or a StatefulSet) of unpinned pods that share the partitions
    (rendezvous hashing over the live ones, consumers/rebalance.py) and move them as pods come
    and go. Its count is fixed at 1..P, or a KEDA ScaledObject's: minReplicaCount >= 1 (a
    partition always has a consumer), maxReplicaCount <= P (a pod beyond P would own none),
    one trigger on each of the route's partition queues and on nothing else. Not
    `--no-rebalance` where it can run several pods: they would all subscribe to every
    partition, the first consuming them and the others standing by;
  - pinned: a StatefulSet whose pod I runs as replica I of PKGQ_REPLICA_COUNT (= replicas,
    1..P; the index from the pod-index label; Parallel), never KEDA-scaled: a new count needs
    a new PKGQ_REPLICA_COUNT, which restarts every pod.
- Any other ScaledObject targets a workload that consumes a queue that is not
  single-active-consumer (the dead-letter ingester), where every pod added takes a share.
"""

from __future__ import annotations

from typing import Any

from connections import KEDA_DEFAULT_MAX_REPLICAS
from workloads import POD_INDEX, WORKLOADS, args_of, env_entry, pod_spec, settings_of

Doc = dict[str, Any]

VALUED_OPTIONS = ("--replica", "--concurrency")
"""`pkgq run` options that take the next word as their value."""


def route_run(doc: Doc) -> str | None:
    """The route ("telecom.X") a workload's pods consume when they run `pkgq run X --no-ingest`
    with any options; None for anything else (another command, several routes or none, the
    ingester in the same process)."""
    args = args_of(doc)
    if args[:1] != ["run"]:
        return None
    names: list[str] = []
    options: list[str] = []
    rest = iter(args[1:])
    for arg in rest:
        if arg in VALUED_OPTIONS:
            next(rest, None)
            options.append(arg)
        elif arg.startswith("-"):
            options.append(arg.partition("=")[0])
        else:
            names.append(arg)
    if len(names) != 1 or "--no-ingest" not in options or "--ingest" in options:
        return None
    return f"telecom.{names[0].removeprefix('telecom.')}"


def pinned_by(doc: Doc, configmaps: dict[str, Doc]) -> str | None:
    """What pins the workload's pods to fixed partitions (`--replica`, PKGQ_REPLICA or
    PKGQ_REPLICA_COUNT), or None: they rebalance."""
    args = [a.partition("=")[0] for a in args_of(doc)]
    if "--replica" in args:
        return "--replica"
    settings = settings_of(pod_spec(doc)["containers"][0], configmaps)
    for name in ("PKGQ_REPLICA", "PKGQ_REPLICA_COUNT"):
        if name in settings or env_entry(pod_spec(doc)["containers"][0], name) is not None:
            return name
    return None


def rebalances(doc: Doc) -> bool:
    """Whether the pods share the partitions (`--rebalance`, the default) rather than each
    subscribing to every one (`--no-rebalance`; the last of the two wins)."""
    flags = [a for a in args_of(doc) if a in ("--rebalance", "--no-rebalance")]
    return flags[-1:] != ["--no-rebalance"]


def scaled_targets(kinds: dict[str, dict[str, Doc]]) -> set[tuple[str, str]]:
    """(kind, name) of every workload a ScaledObject scales."""
    return {
        (d["spec"]["scaleTargetRef"].get("kind", "Deployment"), d["spec"]["scaleTargetRef"]["name"])
        for d in kinds.get("ScaledObject", {}).values()
    }


def keda_errors(
    workloads: dict[str, Doc],
    kinds: dict[str, dict[str, Doc]],
    shared_queues: set[str],
    routes: dict[str, list[str]],
) -> list[str]:
    """`routes`: route -> its queues in the definitions; `shared_queues`: the queues that are
    not single-active-consumer."""
    errors: list[str] = []
    auths = kinds.get("TriggerAuthentication", {})
    configmaps = kinds.get("ConfigMap", {})
    for name, doc in kinds.get("ScaledObject", {}).items():
        where = f"ScaledObject/{name}"
        spec = doc["spec"]
        target = spec["scaleTargetRef"]
        kind = target.get("kind", "Deployment")
        scaled = kinds.get(kind, {}).get(target["name"]) if kind in WORKLOADS else None
        allowed, why = (
            shared_queues,
            f"a queue whose consumers share the work {sorted(shared_queues)}",
        )
        if scaled is None:
            errors.append(
                f"{where}: target {kind}/{target['name']} is not a rendered Deployment or "
                "StatefulSet"
            )
        elif args_of(scaled)[:1] == ["run"]:
            route = route_run(scaled)
            queues = routes.get(route or "", [])
            found = _route_target_errors(where, scaled, spec, route, queues, configmaps)
            errors += found
            if len(queues) > 1:
                allowed, why = set(queues), f"one of {route}'s partition queues"
                triggered = {t["metadata"].get("queueName") for t in spec["triggers"]}
                missing = sorted(set(queues) - triggered)
                if missing:
                    errors.append(
                        f"{where}: no trigger on {missing}: a backlog there would not add pods "
                        f"(one trigger per partition queue of {route})"
                    )
        if scaled is not None and scaled["spec"].get("replicas") is not None:
            errors.append(f"{kind}/{target['name']}: sets replicas, but KEDA scales it")
        for trigger in spec["triggers"]:
            meta = trigger["metadata"]
            if trigger["type"] != "rabbitmq" or meta.get("mode") != "QueueLength":
                errors.append(f"{where}: trigger must be rabbitmq, mode QueueLength")
            if "host" in meta or "hostFromEnv" in meta:
                errors.append(f"{where}: the broker URL belongs in the auth ref")
            if meta.get("queueName") not in allowed:
                errors.append(f"{where}: trigger on {meta.get('queueName')!r}, not {why}")
            auth = trigger.get("authenticationRef", {})
            if auth.get("kind", "TriggerAuthentication") != "TriggerAuthentication" or (
                auth.get("name") not in auths
            ):
                errors.append(f"{where}: authenticationRef does not resolve")
        if spec.get("minReplicaCount", 0) < 1:
            errors.append(f"{where}: minReplicaCount must keep a consumer running")
    scaled_names = {name for _, name in scaled_targets(kinds)}
    for name, doc in workloads.items():
        replicas = doc["spec"].get("replicas")
        fixed = isinstance(replicas, int) and replicas >= 1
        if doc["kind"] == "Deployment" and name not in scaled_names and not fixed:
            errors.append(f"Deployment/{name}: not autoscaled, so it must set replicas >= 1")
    return errors


def _route_target_errors(
    where: str,
    scaled: Doc,
    spec: Doc,
    route: str | None,
    queues: list[str],
    configmaps: dict[str, Doc],
) -> list[str]:
    """A ScaledObject on a route consumer: only on an elastic workload of a partitioned route,
    at most one pod per partition."""
    target = f"{scaled['kind']}/{scaled['metadata']['name']}"
    if route is None or len(queues) < 2:
        return [
            f"{where}: scales {target}, a route consumer of {route or 'several routes'}, not "
            "partitioned: its queue is single-active-consumer, where an added pod only stands by"
        ]
    errors: list[str] = []
    how = pinned_by(scaled, configmaps)
    if how is not None:
        errors.append(
            f"{where}: scales {target}, whose pods are pinned ({how}): a new count needs a new "
            "PKGQ_REPLICA_COUNT, which restarts every replica; scale an elastic (unpinned) "
            "workload instead"
        )
    if not rebalances(scaled):
        errors.append(
            f"{where}: scales {target}, which runs --no-rebalance: its pods would all subscribe "
            "to every partition, the first consuming them and the others standing by"
        )
    most = spec.get("maxReplicaCount", KEDA_DEFAULT_MAX_REPLICAS)
    if not isinstance(most, int) or most > len(queues):
        unset = "" if "maxReplicaCount" in spec else " (unset: KEDA's default)"
        errors.append(
            f"{where}: maxReplicaCount {most}{unset} exceeds {route}'s {len(queues)} "
            f"partitions: a pod beyond {len(queues)} would own none"
        )
    return errors


def partitioned_errors(
    doc: Doc, configmaps: dict[str, Doc], partitions: int, scaled: bool
) -> list[str]:
    """The one workload of a partitioned route: elastic (a fixed count of 1..P, or KEDA's, see
    keda_errors) or pinned (a StatefulSet, replica I of PKGQ_REPLICA_COUNT from the ordinal)."""
    where = f"{doc['kind']}/{doc['metadata']['name']}"
    how = pinned_by(doc, configmaps)
    if how in ("--replica", "PKGQ_REPLICA"):
        return [
            f"{where}: {how} pins every pod to the same replica index: pin a StatefulSet with "
            f"PKGQ_REPLICA_COUNT and the index from {POD_INDEX}, or leave the pods unpinned"
        ]
    if how is not None and doc["kind"] != "StatefulSet":
        return [
            f"{where}: pinned ({how}) but not a StatefulSet: a pinned pod's replica index is a "
            "StatefulSet's pod ordinal"
        ]
    if how is not None:
        container = pod_spec(doc)["containers"][0]
        return _replica_errors(doc, container, settings_of(container, configmaps), partitions)
    if scaled:
        return []  # keda_errors checks the ScaledObject
    errors: list[str] = []
    replicas = doc["spec"].get("replicas", 1)
    if not isinstance(replicas, int) or not 1 <= replicas <= partitions:
        errors.append(
            f"{where}: replicas {replicas} must be 1..{partitions}: its pods share the "
            f"partitions, and one beyond {partitions} would own none"
        )
    elif replicas > 1 and not rebalances(doc):
        errors.append(
            f"{where}: {replicas} pods with --no-rebalance would all subscribe to every "
            "partition, the first consuming them and the others standing by"
        )
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
