"""Layer 3 of deploy/k8s/verify.sh's checks for a partitioned route's consumers (scaling.py):
broken copies of dev's documents that pkgq's rules must reject, around both layouts. dev runs
the route as an elastic Deployment scaled by KEDA; the pinned alternative, which no overlay
renders, is built here from the StatefulSet the repository ships (base/partitioned/) and must
pass every check before its broken copies count."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from typing import Any

from memory_budget import memory_errors
from rules import rule_errors
from scaling import route_run
from schemas import Checker
from workloads import WORKLOADS

Doc = dict[str, Any]

SCALING_SELF_TESTS = 15
"""The broken copies below (the pinned alternative's acceptance is checked besides)."""


def route_workload(docs: list[Doc], route: str) -> tuple[int, Doc]:
    """The index and the document of the workload that runs `pkgq run ROUTE --no-ingest`,
    whatever its kind."""
    for index, doc in enumerate(docs):
        if doc["kind"] in WORKLOADS and route_run(doc) == route:
            return index, doc
    raise LookupError(f"no Deployment or StatefulSet runs {route}")


def _scaler(docs: list[Doc], target: str) -> Doc:
    for doc in docs:
        if doc["kind"] == "ScaledObject" and doc["spec"]["scaleTargetRef"]["name"] == target:
            return doc
    raise LookupError(f"no ScaledObject scales {target}")


def pinned_alternative(docs: list[Doc], route: str, partitions: int, template: Doc) -> list[Doc]:
    """`docs` with the route's elastic workload replaced by the pinned layout: a StatefulSet of
    one pod per partition, pod I replica I of PKGQ_REPLICA_COUNT, its StatefulSet fields and
    replica index taken from `template` (base/partitioned/statefulset.yaml), not KEDA-scaled."""
    index, elastic = route_workload(docs, route)
    name = elastic["metadata"]["name"]
    pinned = copy.deepcopy(elastic)
    pinned["kind"] = "StatefulSet"
    spec = pinned["spec"]
    for field in ("strategy", "progressDeadlineSeconds", "paused"):
        spec.pop(field, None)
    for field in ("podManagementPolicy", "updateStrategy"):
        spec[field] = copy.deepcopy(template["spec"][field])
    spec["serviceName"] = name
    spec["replicas"] = partitions
    container = spec["template"]["spec"]["containers"][0]
    shipped = {e["name"]: e for e in template["spec"]["template"]["spec"]["containers"][0]["env"]}
    container["env"] = [
        copy.deepcopy(shipped["PKGQ_REPLICA_INDEX"]),
        {"name": "PKGQ_REPLICA_COUNT", "value": str(partitions)},
        *[e for e in container.get("env", []) if not e["name"].startswith("PKGQ_REPLICA")],
    ]
    changed = [*docs[:index], pinned, *docs[index + 1 :]]
    return [
        d
        for d in changed
        if not (d["kind"] == "ScaledObject" and d["spec"]["scaleTargetRef"]["name"] == name)
    ]


def scaling_self_tests(
    docs: list[Doc],
    routes: dict[str, list[str]],
    shared: set[str],
    checker: Checker,
    max_message_size: int,
    pkgq: Doc,
    template: Doc,
) -> Iterator[str]:
    """Yield a description of each broken copy the rules failed to reject, and of the pinned
    alternative's errors, if any."""
    route = next(r for r, queues in sorted(routes.items()) if len(queues) > 1)
    partitions = len(routes[route])
    _, elastic = route_workload(docs, route)
    name = elastic["metadata"]["name"]

    def rejects(base: list[Doc], breaks: Callable[[list[Doc]], None], needle: str) -> bool:
        changed = copy.deepcopy(base)
        breaks(changed)
        return any(needle in e for e in rule_errors(changed, routes, shared))

    def workload(changed: list[Doc]) -> Doc:
        return route_workload(changed, route)[1]

    def args(changed: list[Doc]) -> list[str]:
        found: list[str] = workload(changed)["spec"]["template"]["spec"]["containers"][0]["args"]
        return found

    def scaler(changed: list[Doc]) -> Doc:
        return _scaler(changed, name)

    def unscaled(changed: list[Doc], replicas: int) -> None:
        changed.remove(scaler(changed))
        workload(changed)["spec"]["replicas"] = replicas

    def fixed_without_rebalance(changed: list[Doc]) -> None:
        unscaled(changed, 2)
        args(changed).append("--no-rebalance")

    def pinned_env(changed: list[Doc]) -> None:
        env = workload(changed)["spec"]["template"]["spec"]["containers"][0]["env"]
        env.append({"name": "PKGQ_REPLICA_COUNT", "value": str(partitions)})

    def without_max(changed: list[Doc]) -> None:
        scaler(changed)["spec"].pop("maxReplicaCount")

    def last_trigger_dropped(changed: list[Doc]) -> None:
        scaler(changed)["spec"]["triggers"].pop()

    def trigger_elsewhere(changed: list[Doc]) -> None:
        trigger = scaler(changed)["spec"]["triggers"][0]["metadata"]
        trigger["queueName"] = sorted(shared)[0]

    def plain_route(changed: list[Doc]) -> None:
        plain = next(r for r, queues in sorted(routes.items()) if len(queues) == 1)
        target = route_workload(changed, plain)[1]["metadata"]["name"]
        scaler(changed)["spec"]["scaleTargetRef"]["name"] = target

    elastic_cases: list[tuple[str, Callable[[list[Doc]], None], str]] = [
        ("KEDA scaling a plain route's consumer", plain_route, "not partitioned"),
        (
            f"KEDA scaling {route} beyond its {partitions} partitions",
            lambda c: scaler(c)["spec"].update(maxReplicaCount=partitions + 1),
            "maxReplicaCount",
        ),
        ("a route's ScaledObject without maxReplicaCount", without_max, "KEDA's default"),
        (
            "a route's ScaledObject with minReplicaCount 0",
            lambda c: scaler(c)["spec"].update(minReplicaCount=0),
            "minReplicaCount",
        ),
        (
            f"partition queues of {route} without a consumer",
            lambda c: c.remove(workload(c)),
            "no consumer for",
        ),
        (
            "a KEDA-scaled route consumer with --no-rebalance",
            lambda c: args(c).append("--no-rebalance"),
            "--no-rebalance",
        ),
        (
            "a KEDA-scaled route consumer pinned by --replica",
            lambda c: args(c).extend(["--replica", f"0/{partitions}"]),
            "pinned (--replica)",
        ),
        ("a Deployment pinned by PKGQ_REPLICA_COUNT", pinned_env, "not a StatefulSet"),
        ("a partition queue without a KEDA trigger", last_trigger_dropped, "no trigger on"),
        ("a route's KEDA trigger on another queue", trigger_elsewhere, "partition queues"),
        (
            f"{partitions + 1} fixed elastic pods for {partitions} partitions",
            lambda c: unscaled(c, partitions + 1),
            "would own none",
        ),
        ("2 fixed elastic pods with --no-rebalance", fixed_without_rebalance, "--no-rebalance"),
    ]
    for what, breaks, needle in elastic_cases:
        if not rejects(docs, breaks, needle):
            yield f"{what} passed pkgq's rules"

    pinned = pinned_alternative(docs, route, partitions, template)
    _, statefulset = route_workload(pinned, route)
    accepted = [
        *checker.schema_errors(statefulset),
        *rule_errors(pinned, routes, shared),
        *memory_errors(pinned, max_message_size, pkgq),
    ]
    if accepted:
        yield f"the pinned StatefulSet (base/partitioned/) was refused: {accepted}"

    def keda_on_pinned(changed: list[Doc]) -> None:
        scaled = copy.deepcopy(_scaler(docs, name))
        scaled["spec"]["scaleTargetRef"]["kind"] = "StatefulSet"
        changed.append(scaled)
        workload(changed)["spec"].pop("replicas")

    def count_differs(changed: list[Doc]) -> None:
        workload(changed)["spec"]["replicas"] = partitions - 1

    if not rejects(pinned, keda_on_pinned, "pinned (PKGQ_REPLICA_COUNT)"):
        yield "KEDA scaling a pinned StatefulSet passed pkgq's rules"
    if not rejects(pinned, count_differs, "PKGQ_REPLICA_COUNT"):
        yield "a StatefulSet whose replicas differ from PKGQ_REPLICA_COUNT passed pkgq's rules"
    broken = copy.deepcopy(statefulset)
    broken["spec"]["podManagementPolicyy"] = "Parallel"
    if not checker.schema_errors(broken):
        yield "StatefulSet with spec.podManagementPolicyy passed the Kubernetes schema"
