"""Check pkgq's rendered Kubernetes manifests and its Dockerfile (run by deploy/k8s/verify.sh).

Runs in the tools virtualenv that verify.sh installs (deploy/k8s/tools/requirements.txt), never
in the project's own. Offline. Three layers, every one of which fails the run:

1. Schemas, strict (schemas.py): built-in kinds against Kubernetes' OpenAPI schemas, KEDA's
   ScaledObject and TriggerAuthentication against schemas generated from KEDA's CRDs, the
   RabbitmqCluster and CloudNativePG Cluster against their operators' CRD schemas (crds/).
2. pkgq's own rules (rules.py, pods.py, scaling.py, replication.py, connections.py): hardened
   pods, least privilege, one workload per route in the overlay's rabbitmq-definitions.json (a
   partitioned route's elastic or pinned), autoscaling only where pods add throughput (the
   ingester, a partitioned route's elastic pods up to one per partition); in prod
   (REPLICATED), the replicated broker and database and quorum queues; and every pod's memory
   limit holds its in-flight message bodies (memory_budget.py).
3. Self-tests (selftests.py, scaling_selftests.py): deliberately broken copies of rendered
   documents must be rejected by 1 and 2, and the pinned StatefulSet that no overlay renders
   (base/partitioned/) must pass them.

Also checks the Dockerfile and .dockerignore statically (dockerfile.py).
"""

from __future__ import annotations

import argparse
import json
import sys
from importlib.metadata import version as dist_version
from pathlib import Path
from typing import Any

import yaml
from dockerfile import dockerfile_errors
from memory_budget import broker_max_message_size, memory_errors
from replication import rabbitmq_conf, replication_errors
from rules import commands, rule_errors
from schemas import KEDA_GROUP, Checker
from selftests import SELF_TESTS, Overlay, self_tests
from workloads import non_exclusive_queues, route_queues

Doc = dict[str, Any]

REPLICATED = {"prod"}
"""The overlays whose broker and database are the replicated clusters they describe."""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", type=Path, required=True)
    parser.add_argument("--k8s-version", required=True)
    parser.add_argument(
        "--definitions",
        action="append",
        required=True,
        help="NAME=FILE: the broker definitions overlay NAME runs with (one per overlay)",
    )
    parser.add_argument("--commands-out", type=Path, help="write the pkgq command lines here")
    parser.add_argument(
        "--pkgq-defaults",
        type=Path,
        required=True,
        help="JSON from pkgq's own code: prefetch, batch_size, relay_batch_size, relay_rounds, "
        "routes (the memory check's defaults)",
    )
    parser.add_argument("rendered", nargs="+", help="NAME=FILE: kustomize output of an overlay")
    opts = parser.parse_args()

    checker = Checker(opts.k8s_version)
    definitions = {
        name: Path(path) for name, _, path in (d.partition("=") for d in opts.definitions)
    }
    broker_conf_path = opts.repo / "deploy/rabbitmq/rabbitmq.conf"
    max_message_size = broker_max_message_size(broker_conf_path)
    broker_conf = rabbitmq_conf(broker_conf_path.read_text())
    advanced = (opts.repo / "deploy/rabbitmq/advanced.config").read_text()
    pkgq_defaults = json.loads(opts.pkgq_defaults.read_text())
    failures: list[str] = []
    counts: list[str] = []
    all_commands: set[tuple[str, ...]] = set()
    overlays: dict[str, Overlay] = {}
    for item in opts.rendered:
        overlay, _, filename = item.partition("=")
        docs = [d for d in yaml.safe_load_all(Path(filename).read_text()) if d]
        routes = route_queues(definitions[overlay])
        shared = non_exclusive_queues(definitions[overlay])
        overlays[overlay] = Overlay(docs, routes, shared)
        keda = operated = 0
        for doc in docs:
            name = f"{overlay}: {doc.get('kind')}/{doc.get('metadata', {}).get('name')}"
            failures += [f"{name}: {e}" for e in checker.schema_errors(doc)]
            keda += doc.get("apiVersion") == KEDA_GROUP
            operated += (doc.get("apiVersion"), doc.get("kind")) in checker.crds
        failures += [f"{overlay}: {e}" for e in rule_errors(docs, routes, shared)]
        if overlay in REPLICATED:
            found = replication_errors(docs, broker_conf, pkgq_defaults, advanced)
            failures += [f"{overlay}: {e}" for e in found]
        failures += [
            f"{overlay}: {e}" for e in memory_errors(docs, max_message_size, pkgq_defaults)
        ]
        all_commands |= commands(docs)
        counts.append(f"{overlay} {len(docs)} documents ({keda} KEDA, {operated} operators')")
    pinned_template = yaml.safe_load(
        (opts.repo / "deploy/k8s/base/partitioned/statefulset.yaml").read_text()
    )
    missed = list(
        self_tests(
            overlays,
            checker,
            broker_conf,
            max_message_size,
            pkgq_defaults,
            advanced,
            pinned_template,
        )
    )
    failures += [f"self-test: {m}" for m in missed]
    failures += dockerfile_errors(opts.repo)
    if opts.commands_out:
        opts.commands_out.write_text("".join(" ".join(c) + "\n" for c in sorted(all_commands)))
    for failure in failures:
        print(failure, file=sys.stderr)
    if failures:
        return 1
    routes = next(iter(overlays.values())).routes
    partitioned = sum(1 for q in routes.values() if len(q) > 1)
    print(
        f"{', '.join(counts)}: strict against Kubernetes {opts.k8s_version}, KEDA "
        f"{dist_version('cloudcoil.models.keda')} and operator CRD schemas "
        f"({', '.join(checker.crd_versions())}), {len(routes)} routes covered "
        f"({partitioned} partitioned), {SELF_TESTS} broken variants rejected (the pinned "
        f"StatefulSet alternative accepted), "
        f"every pod's memory limit holds its in-flight bodies at max_message_size "
        f"{max_message_size // 1024} KiB; Dockerfile rules ok"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
