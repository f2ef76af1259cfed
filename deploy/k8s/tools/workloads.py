"""What the checks read from rendered documents and from the broker's definitions: pod specs,
a container's effective PKGQ_* settings, and the route queues pkgq consumes."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

Doc = dict[str, Any]

WORKLOADS = ("Deployment", "StatefulSet")
"""The long-running kinds (a Job runs to completion)."""
SECRET_NAME = "pkgq-secrets"  # noqa: S105 (a Secret object's name, not a password)
PARTITION = re.compile(r"^(?P<route>.+)\.p(?P<k>\d+)$")
POD_INDEX = "metadata.labels['apps.kubernetes.io/pod-index']"


def pod_spec(doc: Doc) -> Doc:
    spec: Doc = doc["spec"]["template"]["spec"]
    return spec


def containers(doc: Doc) -> list[Doc]:
    pod = pod_spec(doc)
    return [*pod.get("initContainers", []), *pod["containers"]]


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(key) == value for key, value in selector.items())


def image_tagged(image: str) -> bool:
    name = image.rsplit("/", 1)[-1]
    if "@sha256:" in image:
        return True
    return ":" in name and not name.endswith(":latest")


def by_kind(docs: list[Doc]) -> dict[str, dict[str, Doc]]:
    found: dict[str, dict[str, Doc]] = {}
    for doc in docs:
        found.setdefault(doc["kind"], {})[doc["metadata"]["name"]] = doc
    return found


def settings_of(container: Doc, configmaps: dict[str, Doc]) -> dict[str, str]:
    """The container's PKGQ_* values from its ConfigMaps and literal env (not secrets)."""
    settings: dict[str, str] = {}
    for source in container.get("envFrom", []):
        ref = source.get("configMapRef", {}).get("name")
        settings.update(configmaps.get(ref, {}).get("data", {}))
    settings.update({e["name"]: e["value"] for e in container.get("env", []) if "value" in e})
    return settings


def env_entry(container: Doc, name: str) -> Doc | None:
    for env in container.get("env", []):
        if env["name"] == name:
            found: Doc = env
            return found
    return None


def secret_key(container: Doc, name: str) -> str | None:
    """The pkgq-secrets key an env variable comes from (None: not from a Secret)."""
    env = env_entry(container, name) or {}
    ref = env.get("valueFrom", {}).get("secretKeyRef")
    return None if ref is None else str(ref["key"])


def args_of(doc: Doc) -> list[str]:
    return list(pod_spec(doc)["containers"][0].get("args", []))


def route_queues(definitions: Path) -> dict[str, list[str]]:
    """The routes pkgq consumes (single-active-consumer queues), each with its queues in the
    definitions: its plain queue, or its partition queues in partition order (the partition
    count is their number). A subscriber route's queue (telecom.package_cancelled: pkgq
    publishes, outside systems consume) is a plain queue and needs no consumer of pkgq's."""
    data = json.loads(definitions.read_text())
    found: dict[str, list[tuple[int, str]]] = {}
    for queue in data["queues"]:
        if not queue["arguments"].get("x-single-active-consumer"):
            continue
        name = queue["name"].split(".", 1)[1]  # without the queue prefix
        partition = PARTITION.match(name)
        route = partition.group("route") if partition else name
        k = int(partition.group("k")) if partition else 0
        found.setdefault(route, []).append((k, queue["name"]))
    return {route: [name for _, name in sorted(queues)] for route, queues in found.items()}


def non_exclusive_queues(definitions: Path) -> set[str]:
    """Queues where every subscriber takes its own share (the dead-letter queue): the only
    ones where more pods add throughput."""
    data = json.loads(definitions.read_text())
    return {
        q["name"]
        for q in data["queues"]
        if not q["arguments"].get("x-single-active-consumer")
        and not q["arguments"].get("x-max-length")  # a subscriber route's announcements
    }
