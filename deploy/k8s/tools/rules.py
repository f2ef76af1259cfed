"""Layer 2 of deploy/k8s/verify.sh's checks: pkgq's own rules over an overlay's documents.

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
- Replicated services (`replication_errors`, for prod): one RabbitmqCluster of 3+ nodes, one
  per machine, pause_minority, with deploy/rabbitmq/rabbitmq.conf's settings; one CloudNativePG
  Cluster of 3+ instances, one per machine, synchronous (durability required, failover quorum),
  pkgq's database and owner, max_connections for every pod's pool; PKGQ_QUEUE_TYPE=quorum.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from workloads import (
    POD_INDEX,
    SECRET_NAME,
    WORKLOADS,
    args_of,
    by_kind,
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
    """Issue 12's least privilege, as the manifests can show it."""
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


RABBITMQ_CLUSTER = ("rabbitmq.com/v1beta1", "RabbitmqCluster")
POSTGRES_CLUSTER = ("postgresql.cnpg.io/v1", "Cluster")
MIN_NODES = 3
HOSTNAME = "kubernetes.io/hostname"
OWNER_ROLE = "pkgq_owner"
DATABASE = "pkgq"
PG_DEFAULT_MAX_CONNECTIONS = 100
PG_DEFAULT_SUPERUSER_RESERVED = 3
KEDA_DEFAULT_MAX_REPLICAS = 100


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
        errors += _connection_errors(doc, docs, pkgq)
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


def _surge(doc: Doc, replicas: int) -> int:
    """Extra pods a Deployment's rolling update runs next to the old ones."""
    strategy = doc["spec"].get("strategy", {})
    if strategy.get("type") == "Recreate":
        return 0
    surge = strategy.get("rollingUpdate", {}).get("maxSurge", "25%")
    if isinstance(surge, str) and surge.endswith("%"):
        return -(-replicas * int(surge[:-1]) // 100)
    return int(surge)


def _connection_errors(database: Doc, docs: list[Doc], pkgq: Doc) -> list[str]:
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
