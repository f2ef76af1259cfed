"""Layer 2 of deploy/k8s/verify.sh's checks for an overlay on replicated services (prod): the
RabbitmqCluster and the CloudNativePG Cluster as pkgq needs them, and quorum queues."""

from __future__ import annotations

from typing import Any

from connections import connection_errors
from workloads import WORKLOADS, by_kind, containers, selects, settings_of

Doc = dict[str, Any]

RABBITMQ_CLUSTER = ("rabbitmq.com/v1beta1", "RabbitmqCluster")
POSTGRES_CLUSTER = ("postgresql.cnpg.io/v1", "Cluster")
MIN_NODES = 3
HOSTNAME = "kubernetes.io/hostname"
OWNER_ROLE = "pkgq_owner"
DATABASE = "pkgq"


def operator_pods(docs: list[Doc]) -> dict[str, dict[str, str]]:
    """The pods an operator makes for a custom resource that has no PodDisruptionBudget of the
    operator's own, by the labels they carry: the RabbitMQ Cluster Operator's (it makes no PDB;
    CloudNativePG makes its own, `enablePDB`)."""
    return {
        f"RabbitmqCluster/{d['metadata']['name']}": {
            "app.kubernetes.io/name": d["metadata"]["name"],
            "app.kubernetes.io/component": "rabbitmq",
            "app.kubernetes.io/part-of": "rabbitmq",
        }
        for d in docs
        if (d.get("apiVersion"), d["kind"]) == RABBITMQ_CLUSTER
    }


def _of_kind(docs: list[Doc], api: tuple[str, str]) -> list[Doc]:
    return [d for d in docs if (d.get("apiVersion"), d["kind"]) == api]


def rabbitmq_conf(text: str) -> dict[str, str]:
    """rabbitmq.conf's sysctl format: `key = value` lines, `#` comments."""
    found: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            key, _, value = line.partition("=")
            found[key.strip()] = value.strip()
    return found


def erlang_terms(text: str) -> str:
    """advanced.config's Erlang terms without `%` comments and whitespace, to compare two copies
    (pkgq's settings hold no `%` or space inside a string)."""
    lines = (line.partition("%")[0] for line in text.splitlines())
    return "".join("".join(lines).split())


def replication_errors(
    docs: list[Doc], broker_conf: dict[str, str], pkgq: Doc, advanced: str = ""
) -> list[str]:
    """An overlay that runs pkgq on replicated services (prod): one RabbitmqCluster of at least
    3 nodes, spread one per Kubernetes node, pausing a minority partition, with pkgq's broker
    settings (`broker_conf`, deploy/rabbitmq/rabbitmq.conf, and `advanced`,
    deploy/rabbitmq/advanced.config, as its advancedConfig); one CloudNativePG Cluster of at
    least 3 instances, one per node, committing synchronously (durability required, failover
    quorum), bootstrapping pkgq's database and owner, room for every pod's pool; and pkgq
    declaring quorum queues (PKGQ_QUEUE_TYPE=quorum)."""
    errors: list[str] = []
    rabbits = _of_kind(docs, RABBITMQ_CLUSTER)
    if len(rabbits) != 1:
        errors.append(f"need exactly one RabbitmqCluster (the broker), found {len(rabbits)}")
    for doc in rabbits:
        errors += _rabbitmq_errors(doc, broker_conf, advanced)
    databases = _of_kind(docs, POSTGRES_CLUSTER)
    if len(databases) != 1:
        errors.append(
            f"need exactly one CloudNativePG Cluster (the database), found {len(databases)}"
        )
    for doc in databases:
        errors += _postgres_errors(doc)
        errors += connection_errors(doc, docs, pkgq)
    kinds = by_kind(docs)
    configmaps = kinds.get("ConfigMap", {})
    for kind in (*WORKLOADS, "Job"):
        for name, doc in kinds.get(kind, {}).items():
            for container in containers(doc):
                queue_type = settings_of(container, configmaps).get("PKGQ_QUEUE_TYPE", "classic")
                if queue_type != "quorum":
                    errors.append(
                        f"{kind}/{name} container {container['name']}: PKGQ_QUEUE_TYPE is "
                        f"{queue_type!r}, must be 'quorum' (queues replicated on the broker's "
                        "nodes; a classic queue lives on one node and goes with it)"
                    )
    return errors


def _anti_affine(terms: list[Doc], labels: dict[str, str]) -> bool:
    """Whether one of the required anti-affinity terms keeps two pods with `labels` off one
    node."""
    return any(
        term.get("topologyKey") == HOSTNAME
        and term.get("labelSelector", {}).get("matchLabels")
        and selects(term["labelSelector"]["matchLabels"], labels)
        for term in terms
    )


def _rabbitmq_errors(doc: Doc, broker_conf: dict[str, str], advanced: str) -> list[str]:
    errors: list[str] = []
    name = doc["metadata"]["name"]
    where = f"RabbitmqCluster/{name}"
    spec = doc["spec"]
    replicas = spec.get("replicas", 1)
    if not isinstance(replicas, int) or replicas < MIN_NODES:
        errors.append(
            f"{where}: replicas {replicas!r}, need at least {MIN_NODES} (a quorum queue "
            "survives the loss of a minority of its nodes: one of three)"
        )
    conf = rabbitmq_conf(spec.get("rabbitmq", {}).get("additionalConfig", ""))
    if conf.get("cluster_partition_handling") != "pause_minority":
        errors.append(
            f"{where}: additionalConfig must set cluster_partition_handling = pause_minority "
            "(the minority side of a partition pauses: two sides never both take writes)"
        )
    for key, value in sorted(broker_conf.items()):
        if conf.get(key) != value:
            errors.append(
                f"{where}: additionalConfig must set {key} = {value}, as "
                f"deploy/rabbitmq/rabbitmq.conf does (found {conf.get(key)!r})"
            )
    found = spec.get("rabbitmq", {}).get("advancedConfig", "")
    if erlang_terms(found) != erlang_terms(advanced):
        errors.append(
            f"{where}: advancedConfig must be deploy/rabbitmq/advanced.config's terms, no more "
            "and no less (add a term there to add it here; the "
            "dead-letter worker's confirm timeout: a dead letter whose confirm was lost with a "
            "node otherwise reaches pkgq 3 minutes late)"
        )
    terms = (
        spec.get("affinity", {})
        .get("podAntiAffinity", {})
        .get("requiredDuringSchedulingIgnoredDuringExecution", [])
    )
    if not _anti_affine(terms, operator_pods([doc])[where]):
        errors.append(
            f"{where}: needs a required pod anti-affinity on {HOSTNAME} selecting "
            f"app.kubernetes.io/name={name} (two nodes on one machine go together)"
        )
    return errors


def _postgres_errors(doc: Doc) -> list[str]:
    errors: list[str] = []
    where = f"Cluster/{doc['metadata']['name']}"
    spec = doc["spec"]
    instances = spec.get("instances", 1)
    if not isinstance(instances, int) or instances < MIN_NODES:
        errors.append(
            f"{where}: instances {instances!r}, need at least {MIN_NODES} (a primary and two "
            "standbys: one standby confirms each commit while the other may be down)"
        )
        instances = MIN_NODES
    sync = spec.get("postgresql", {}).get("synchronous")
    if not isinstance(sync, dict):
        errors.append(
            f"{where}: needs postgresql.synchronous (method any, number 1, dataDurability "
            "required, failoverQuorum true): with asynchronous replication a failover can lose "
            "commits pkgq has already acknowledged to the broker"
        )
    else:
        number = sync.get("number")
        if not isinstance(number, int) or not 1 <= number <= instances - 2:
            errors.append(
                f"{where}: synchronous.number {number!r} must be 1..{instances - 2} (at least "
                "one standby confirms each commit, and one standby may be down without "
                "stopping every write)"
            )
        if sync.get("dataDurability", "required") != "required":
            errors.append(
                f"{where}: synchronous.dataDurability must be 'required' ('preferred' goes "
                "asynchronous when the standbys are gone, and a failover then loses commits)"
            )
        if sync.get("failoverQuorum") is not True:
            errors.append(
                f"{where}: synchronous.failoverQuorum must be true (without it, losing the "
                "primary and the standby that confirmed together promotes one that may lack "
                "acknowledged commits)"
            )
    for legacy in ("minSyncReplicas", "maxSyncReplicas"):
        if legacy in spec:
            errors.append(f"{where}: {legacy} is the older syntax: use postgresql.synchronous")
    if spec.get("enablePDB", True) is not True:
        errors.append(f"{where}: enablePDB must stay true (the operator's PodDisruptionBudgets)")
    affinity = spec.get("affinity", {})
    if (
        affinity.get("enablePodAntiAffinity", True) is not True
        or affinity.get("podAntiAffinityType") != "required"
        or affinity.get("topologyKey", HOSTNAME) != HOSTNAME
    ):
        errors.append(
            f"{where}: affinity must be podAntiAffinityType required on {HOSTNAME} (a standby "
            "on its primary's machine confirms commits that machine takes away with both)"
        )
    initdb = spec.get("bootstrap", {}).get("initdb", {})
    if initdb.get("database") != DATABASE or initdb.get("owner") != OWNER_ROLE:
        errors.append(
            f"{where}: bootstrap.initdb must create database {DATABASE!r} owned by "
            f"{OWNER_ROLE!r} (the role migrate-dsn connects as)"
        )
    for role in spec.get("managed", {}).get("roles", []):
        granted = [
            p
            for p in ("superuser", "createdb", "createrole", "replication", "bypassrls")
            if role.get(p)
        ]
        if granted:
            errors.append(f"{where}: managed role {role['name']!r} must not have {granted}")
    return errors
