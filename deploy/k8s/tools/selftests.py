"""Layer 3 of deploy/k8s/verify.sh's checks: deliberately broken copies of rendered documents,
each of which the schemas (layer 1) or pkgq's rules (layer 2) must reject."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

from memory_budget import memory_errors
from replication import replication_errors
from rules import rule_errors
from scaling_selftests import SCALING_SELF_TESTS, route_workload, scaling_self_tests
from schemas import Checker

Doc = dict[str, Any]

SELF_TESTS = 30 + SCALING_SELF_TESTS


class Overlay(NamedTuple):
    docs: list[Doc]
    routes: dict[str, list[str]]
    """route -> its queues in the overlay's definitions (its partition queues, or one)"""
    shared: set[str]
    """the queues that are not single-active-consumer"""


def _first(docs: list[Doc], kind: str, pick: str = "") -> tuple[int, Doc]:
    for index, doc in enumerate(docs):
        if doc["kind"] == kind and pick in doc["metadata"]["name"]:
            return index, copy.deepcopy(doc)
    raise LookupError(kind)


def _container(doc: Doc) -> Doc:
    found: Doc = doc["spec"]["template"]["spec"]["containers"][0]
    return found


def self_tests(
    overlays: dict[str, Overlay],
    checker: Checker,
    broker_conf: dict[str, str],
    max_message_size: int,
    pkgq: Doc,
    advanced: str,
    pinned_template: Doc,
) -> Iterator[str]:
    """Yield a description of each of the SELF_TESTS deliberately broken documents that the
    checks failed to reject: copies of dev's documents (scaling_selftests.py for a partitioned
    route's consumers, elastic and pinned: `pinned_template` is base/partitioned's
    StatefulSet), and of prod's for its replicated services."""
    docs, routes, shared = overlays["dev"]

    def rules_reject(kind: str, pick: str, breaks: Callable[[Doc], None], needle: str) -> bool:
        i, doc = _first(docs, kind, pick)
        breaks(doc)
        found = rule_errors([*docs[:i], doc, *docs[i + 1 :]], routes, shared)
        return any(needle in e for e in found)

    route = next(r for r, queues in sorted(routes.items()) if len(queues) > 1)
    i, doc = route_workload(docs, route)
    doc = copy.deepcopy(doc)
    _container(doc)["resources"]["limits"]["memory"] = "256Mi"
    if not memory_errors([*docs[:i], doc, *docs[i + 1 :]], max_message_size, pkgq):
        yield "a partitioned consumer with no room for all its partitions passed the memory check"
    i, doc = _first(docs, "ScaledObject")
    doc["spec"]["triggers"][0]["metadataa"] = doc["spec"]["triggers"][0]["metadata"]
    if not checker.schema_errors(doc):
        yield "ScaledObject with spec.triggers[0].metadataa passed the KEDA schema"
    i, doc = _first(docs, "ScaledObject")
    doc["spec"]["triggers"][0]["metadata"]["value"] = 1000
    if not checker.schema_errors(doc):
        yield "ScaledObject with a non-string trigger metadata value passed the KEDA schema"
    i, doc = _first(docs, "TriggerAuthentication")
    doc["spec"]["secretTargetRef"][0]["paramter"] = "host"
    if not checker.schema_errors(doc):
        yield "TriggerAuthentication with secretTargetRef[0].paramter passed the KEDA schema"
    i, doc = _first(docs, "Deployment")
    _container(doc)["livenessProbes"] = {}
    if not checker.schema_errors(doc):
        yield "Deployment with a container's livenessProbes passed the Kubernetes schema"
    i, doc = _first(docs, "PodDisruptionBudget")
    doc["spec"]["maxUnavailabel"] = 1
    if not checker.schema_errors(doc):
        yield "PodDisruptionBudget with spec.maxUnavailabel passed the Kubernetes schema"

    def writable(doc: Doc) -> None:
        _container(doc)["securityContext"].pop("readOnlyRootFilesystem")

    if not rules_reject("Deployment", "relay", writable, "readOnlyRootFilesystem"):
        yield "a writable root filesystem passed pkgq's rules"

    def short_grace(doc: Doc) -> None:
        doc["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = 30

    if not rules_reject("Deployment", "relay", short_grace, "terminationGracePeriodSeconds"):
        yield "a grace period equal to the drain passed pkgq's rules"
    if not rules_reject(
        "ConfigMap", "", lambda d: d["data"].pop("PKGQ_HTTP_HOST"), "PKGQ_HTTP_HOST"
    ):
        yield "a status port left on loopback passed pkgq's rules"

    def wrong_queue(doc: Doc) -> None:
        doc["spec"]["triggers"][0]["metadata"]["queueName"] = "pkgq.telecom.usage_record.p0"

    if not rules_reject(
        "ScaledObject", "dlq-ingest", wrong_queue, "not a queue whose consumers share"
    ):
        yield "the ingester's ScaledObject on a partition queue passed pkgq's rules"

    def runtime_credentials(doc: Doc) -> None:
        doc["spec"]["secretTargetRef"][0]["key"] = "amqp-url"

    if not rules_reject("TriggerAuthentication", "", runtime_credentials, "autoscaler"):
        yield "KEDA authenticating with the runtime's credentials passed pkgq's rules"
    if not rules_reject(
        "ConfigMap", "", lambda d: d["data"].pop("PKGQ_DECLARE_TOPOLOGY"), "DECLARE_TOPOLOGY"
    ):
        yield "runtime pods that declare the topology passed pkgq's rules"

    def runtime_migrates(doc: Doc) -> None:
        for env in _container(doc)["env"]:
            if env["name"] == "PKGQ_MIGRATE_DSN":
                env["valueFrom"]["secretKeyRef"]["key"] = "postgres-dsn"

    if not rules_reject("Job", "migrate", runtime_migrates, "PKGQ_MIGRATE_DSN"):
        yield "a migrate Job connecting as the runtime role passed pkgq's rules"

    def stale_map(doc: Doc) -> None:
        doc["data"]["PKGQ_PARTITIONS"] = '{"telecom.usage_record": 8}'

    if not rules_reject("ConfigMap", "", stale_map, "regenerate"):
        yield "a partition map that differs from the definitions passed pkgq's rules"

    yield from scaling_self_tests(
        docs, routes, shared, checker, max_message_size, pkgq, pinned_template
    )
    yield from _replicated_self_tests(overlays["prod"], checker, broker_conf, pkgq, advanced)


RABBITMQ = "RabbitmqCluster"
POSTGRES = "Cluster"


def _replicated_self_tests(
    prod: Overlay, checker: Checker, broker_conf: dict[str, str], pkgq: Doc, advanced: str
) -> Iterator[str]:
    """16 broken copies of prod's RabbitmqCluster, CloudNativePG Cluster and settings."""
    docs = prod.docs

    def schema_rejects(kind: str, breaks: Callable[[Doc], None]) -> bool:
        _, doc = _first(docs, kind)
        breaks(doc)
        return bool(checker.schema_errors(doc))

    def rules_reject(kind: str, breaks: Callable[[Doc], None], needle: str, pick: str = "") -> bool:
        i, doc = _first(docs, kind, pick)
        breaks(doc)
        changed = [*docs[:i], doc, *docs[i + 1 :]]
        found = rule_errors(changed, prod.routes, prod.shared)
        found += replication_errors(changed, broker_conf, pkgq, advanced)
        return any(needle in e for e in found)

    def removed(kind: str, pick: str, needle: str) -> bool:
        i, _ = _first(docs, kind, pick)
        found = rule_errors([*docs[:i], *docs[i + 1 :]], prod.routes, prod.shared)
        return any(needle in e for e in found)

    if not schema_rejects(RABBITMQ, lambda d: d["spec"].update(replicas="three")):
        yield "RabbitmqCluster with replicas 'three' passed its CRD schema"
    if not schema_rejects(
        RABBITMQ, lambda d: d["spec"]["rabbitmq"].update(additionalPlugin=["rabbitmq_shovel"])
    ):
        yield "RabbitmqCluster with spec.rabbitmq.additionalPlugin passed its CRD schema"
    if not schema_rejects(
        RABBITMQ,
        lambda d: d["spec"]["rabbitmq"].update(additionalPlugins=["rabbitmq shovel"]),
    ):
        yield "RabbitmqCluster with a plugin name its CRD's pattern refuses passed the schema"
    if not schema_rejects(
        POSTGRES, lambda d: d["spec"]["postgresql"].update(synchronus=d["spec"]["postgresql"])
    ):
        yield "CloudNativePG Cluster with spec.postgresql.synchronus passed its CRD schema"
    if not schema_rejects(
        POSTGRES, lambda d: d["spec"]["postgresql"]["synchronous"].update(method="all")
    ):
        yield "CloudNativePG Cluster with synchronous.method 'all' passed its CRD schema"
    if not schema_rejects(POSTGRES, lambda d: d["metadata"].update(label={"a": "b"})):
        yield "CloudNativePG Cluster with metadata.label passed the ObjectMeta schema"

    if not rules_reject(RABBITMQ, lambda d: d["spec"].update(replicas=1), "replicas"):
        yield "a single-node RabbitmqCluster in prod passed pkgq's rules"

    def no_size_limit(doc: Doc) -> None:
        config = doc["spec"]["rabbitmq"]["additionalConfig"]
        doc["spec"]["rabbitmq"]["additionalConfig"] = "\n".join(
            line for line in config.splitlines() if not line.startswith("max_message_size")
        )

    if not rules_reject(RABBITMQ, no_size_limit, "max_message_size"):
        yield "a RabbitmqCluster without pkgq's max_message_size passed pkgq's rules"
    if not rules_reject(
        RABBITMQ, lambda d: d["spec"]["rabbitmq"].pop("advancedConfig"), "advancedConfig"
    ):
        yield "a RabbitmqCluster without pkgq's advanced.config passed pkgq's rules"
    if not removed("PodDisruptionBudget", "rabbitmq", "RabbitmqCluster/"):
        yield "a RabbitmqCluster without a PodDisruptionBudget passed pkgq's rules"
    if not rules_reject(POSTGRES, lambda d: d["spec"].update(instances=1), "instances"):
        yield "a CloudNativePG Cluster of 1 instance in prod passed pkgq's rules"
    if not rules_reject(
        POSTGRES, lambda d: d["spec"]["postgresql"].pop("synchronous"), "synchronous"
    ):
        yield "an asynchronously replicated CloudNativePG Cluster passed pkgq's rules"
    if not rules_reject(
        POSTGRES,
        lambda d: d["spec"]["postgresql"]["synchronous"].update(dataDurability="preferred"),
        "dataDurability",
    ):
        yield "synchronous replication with dataDurability 'preferred' passed pkgq's rules"
    if not rules_reject(
        POSTGRES,
        lambda d: d["spec"]["postgresql"]["synchronous"].pop("failoverQuorum"),
        "failoverQuorum",
    ):
        yield "synchronous replication without the failover quorum passed pkgq's rules"
    if not rules_reject(
        POSTGRES,
        lambda d: d["spec"]["postgresql"]["parameters"].update(max_connections="100"),
        "max_connections",
    ):
        yield "a database whose max_connections cannot hold every pod's pool passed pkgq's rules"
    if not rules_reject(
        "ConfigMap", lambda d: d["data"].update(PKGQ_QUEUE_TYPE="classic"), "PKGQ_QUEUE_TYPE"
    ):
        yield "prod pods declaring classic queues passed pkgq's rules"
