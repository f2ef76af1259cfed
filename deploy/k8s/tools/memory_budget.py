"""The memory check of deploy/k8s/verify.sh: every pkgq pod's memory limit holds what it can
buffer at once, message bodies at the broker's largest size (deploy/rabbitmq/rabbitmq.conf).

Without it a burst of large messages gets a pod OOM-killed, and the same messages redelivered
to the next one. Run from validate.py, in the tools virtualenv; pkgq's own defaults (prefetch,
batch sizes, the relay's rounds, the routes) come from its code through verify.sh.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

Doc = dict[str, Any]

MIB = 1024 * 1024
PROCESS_RESERVE = 128 * MIB
"""Memory of a pkgq process before any message body: the interpreter and its libraries (about
55 MiB once imported), connection pools, buffers and the allocator's slack."""


def broker_max_message_size(conf: Path) -> int:
    """`max_message_size` from deploy/rabbitmq/rabbitmq.conf (sysctl format)."""
    for line in conf.read_text().splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "max_message_size":
            size = int(value.strip())
            if not 0 < size <= 512 * MIB:  # RabbitMQ's own bounds
                raise ValueError(f"{conf}: max_message_size {size} is not in 1..512 MiB")
            return size
    raise ValueError(f"{conf}: no max_message_size")


def _quantity(text: str) -> int:
    """A Kubernetes memory quantity (256Mi, 1Gi, 500M, 1048576) in bytes."""
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "K": 10**3, "M": 10**6, "G": 10**9}
    for suffix, factor in units.items():
        if text.endswith(suffix):
            return int(float(text[: -len(suffix)]) * factor)
    return int(text)


def bodies_in_memory(args: list[str], settings: dict[str, str], pkgq: Doc) -> int:
    """The most message bodies a process started with `pkgq ARGS` can hold at once.

    A consumer's channel has max(prefetch, batch) deliveries unacknowledged, each a whole body,
    and the batches in hand are decoded besides (a second copy: each worker lane's batch of up
    to batch_max bodies, as many as are buffered, at most what the channel holds). The relay
    runs `relay_rounds` rounds at once, each with up to `relay_batch_size` outbox rows."""
    prefetch = int(settings.get("PKGQ_PREFETCH", pkgq["prefetch"]))
    batch = int(settings.get("PKGQ_BATCH_SIZE", pkgq["batch_size"]))
    batch_max = max(batch, int(settings.get("PKGQ_BATCH_MAX", pkgq["batch_max"])))
    if batch == 1:
        batch_max = 1  # the one-at-a-time mode ignores batch_max
    lanes = int(settings.get("PKGQ_CONCURRENCY", "1"))
    if "--concurrency" in args[:-1]:
        lanes = int(args[args.index("--concurrency") + 1])
    held = max(prefetch, batch)
    per_consumer = held + min(lanes * batch_max, held)
    if args[:1] == ["relay"]:
        relay_batch = int(settings.get("PKGQ_RELAY_BATCH_SIZE", pkgq["relay_batch_size"]))
        return int(pkgq["relay_rounds"]) * relay_batch
    if args[:2] == ["dlq", "ingest"]:
        return per_consumer
    if args[:1] != ["run"]:
        return 0
    partitions = json.loads(settings.get("PKGQ_PARTITIONS", "{}"))
    named: list[str] = []
    rest = iter(args[1:])
    for arg in rest:
        if arg in ("--replica", "--concurrency"):
            next(rest, None)  # the option's value, not a route
        elif not arg.startswith("-"):
            named.append(f"telecom.{arg.removeprefix('telecom.')}")
    queues = sum(partitions.get(route, 1) for route in named or pkgq["routes"])
    ingester = "--ingest" in args or (not named and "--no-ingest" not in args)
    return (queues + ingester) * per_consumer


def memory_errors(docs: list[Doc], max_message_size: int, pkgq: Doc) -> list[str]:
    """Every pkgq pod's memory limit holds its reserve and its most bodies at the broker's
    largest message size: otherwise a burst of large messages gets the pod OOM-killed, and
    redelivered to the next one."""
    errors: list[str] = []
    configmaps = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ConfigMap"}
    for doc in docs:
        if doc["kind"] not in ("Deployment", "StatefulSet"):
            continue
        for container in doc["spec"]["template"]["spec"]["containers"]:
            settings: dict[str, str] = {}
            for source in container.get("envFrom", []):
                ref = source.get("configMapRef", {}).get("name")
                settings.update(configmaps.get(ref, {}).get("data", {}))
            settings.update(
                {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}
            )
            if "PKGQ_ROUTES_FILE" in settings or "PKGQ_ROUTE_SETTINGS" in settings:
                errors.append(
                    f"{doc['kind']}/{doc['metadata']['name']}: PKGQ_ROUTES_FILE or "
                    "PKGQ_ROUTE_SETTINGS hides prefetch and "
                    "batch sizes from the memory check; set them in the ConfigMap"
                )
            bodies = bodies_in_memory(container.get("args", []), settings, pkgq)
            need = PROCESS_RESERVE + bodies * max_message_size
            limit = _quantity(
                str(container.get("resources", {}).get("limits", {}).get("memory", "0"))
            )
            if need > limit:
                errors.append(
                    f"{doc['kind']}/{doc['metadata']['name']}: memory limit {limit // MIB} MiB < "
                    f"{need // MIB} MiB ({PROCESS_RESERVE // MIB} MiB reserve + {bodies} bodies "
                    f"x max_message_size {max_message_size // 1024} KiB)"
                )
    return errors
