"""Check pkgq's rendered Kubernetes manifests and its Dockerfile (run by deploy/k8s/verify.sh).

Runs in the tools virtualenv that verify.sh installs (deploy/k8s/tools/requirements.txt), never
in the project's own. Offline. Three layers, every one of which fails the run:

1. Schemas, strict (an unknown field is an error, as with `kubectl apply`'s strict field
   validation): built-in kinds against the Kubernetes OpenAPI schemas bundled in
   kubernetes-validate (its `-strict` set); KEDA's ScaledObject and TriggerAuthentication against
   a JSON Schema taken from cloudcoil-models-keda (pydantic models generated from KEDA's CRDs),
   made strict here: additionalProperties false wherever properties are listed, no nulls.
2. pkgq's own rules: one Deployment and one ScaledObject per route queue in
   deploy/rabbitmq/definitions.json, the relay, the dead-letter ingester and the migrate Job;
   probes on the status port; a grace period longer than the drain; non-root, read-only,
   no privilege escalation, all capabilities dropped; requests and limits; references to the
   ConfigMap, the Secret, the TriggerAuthentication and the scaled Deployments resolve; every
   pod's memory limit holds its in-flight message bodies (memory_budget.py).
3. Self-tests: deliberately broken copies of rendered documents must be rejected by 1 and 2.

Also checks the Dockerfile and .dockerignore statically (multi-stage, non-root numeric USER,
the Makefile's install line without dev extras, tagged base images, the build context).
"""

from __future__ import annotations

import argparse
import copy
import json
import re
import sys
import tomllib
from collections.abc import Iterator
from importlib.metadata import version as dist_version
from pathlib import Path
from typing import Any

import jsonschema
import yaml
from kubernetes_validate import utils as kv
from memory_budget import broker_max_message_size, memory_errors

Doc = dict[str, Any]

KEDA_GROUP = "keda.sh/v1alpha1"
SECRET_NAME = "pkgq-secrets"  # noqa: S105 (a Secret object's name, not a password)
DEFAULT_DRAIN_TIMEOUT = 30.0
PARTITION_QUEUE = re.compile(r"\.p\d+$")


# --- 1. schemas -----------------------------------------------------------------------------


def _strict(node: Any) -> Any:
    """A pydantic-generated JSON Schema made strict the way the API server treats a CRD."""
    if isinstance(node, list):
        return [_strict(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {key: _strict(value) for key, value in node.items() if key not in ("default", "title")}
    alternatives = out.get("anyOf")
    if isinstance(alternatives, list):
        kept = [alt for alt in alternatives if alt != {"type": "null"}]
        if len(kept) == 1:
            del out["anyOf"]
            out.update(kept[0])
        else:
            out["anyOf"] = kept
    if "properties" in out and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out


def keda_validators() -> dict[str, jsonschema.protocols.Validator]:
    from cloudcoil.models.keda import v1alpha1 as keda

    validators: dict[str, jsonschema.protocols.Validator] = {}
    for model in (keda.ScaledObject, keda.TriggerAuthentication):
        schema = _strict(model.model_json_schema(by_alias=True, mode="validation"))
        schema["required"] = sorted({"apiVersion", "kind", "metadata", *schema["required"]})
        schema["properties"]["metadata"]["required"] = ["name"]
        jsonschema.Draft202012Validator.check_schema(schema)
        validators[model.__name__] = jsonschema.Draft202012Validator(schema)
    return validators


def _path(parts: Any) -> str:
    return ".".join(str(part) for part in parts) or "(document)"


class Checker:
    def __init__(self, k8s_version: str) -> None:
        self.k8s_version = k8s_version
        self.keda = keda_validators()

    def schema_errors(self, doc: Doc) -> list[str]:
        kind = doc.get("kind", "?")
        if doc.get("apiVersion") == KEDA_GROUP:
            validator = self.keda.get(kind)
            if validator is None:
                return [f"no KEDA schema for kind {kind}"]
            return [
                f"{_path(error.absolute_path)}: {error.message}"
                for error in sorted(validator.iter_errors(doc), key=lambda e: list(e.path))
            ]
        try:
            kv.validate(doc, self.k8s_version, strict=True)
        except kv.ValidationError as error:
            return [f"{_path(error.path)}: {error.message}"]
        except kv.SchemaNotFoundError as error:
            return [error.message]
        return []


# --- 2. pkgq's rules ------------------------------------------------------------------------


def _pod_spec(doc: Doc) -> Doc:
    spec: Doc = doc["spec"]["template"]["spec"]
    return spec


def _containers(doc: Doc) -> list[Doc]:
    pod = _pod_spec(doc)
    return [*pod.get("initContainers", []), *pod["containers"]]


def _selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(key) == value for key, value in selector.items())


def _image_tagged(image: str) -> bool:
    name = image.rsplit("/", 1)[-1]
    if "@sha256:" in image:
        return True
    return ":" in name and not name.endswith(":latest")


def route_queues(definitions: Path) -> list[str]:
    """The queues pkgq consumes (single-active-consumer). A subscriber route's queue
    (telecom.package_cancelled: pkgq publishes, outside systems consume) is a plain queue and
    needs no Deployment of pkgq's."""
    data = json.loads(definitions.read_text())
    return [
        queue["name"]
        for queue in data["queues"]
        if queue["arguments"].get("x-single-active-consumer")
        and not PARTITION_QUEUE.search(queue["name"])
    ]


def rule_errors(docs: list[Doc], queues: list[str]) -> list[str]:
    errors: list[str] = []
    by_kind: dict[str, dict[str, Doc]] = {}
    for doc in docs:
        by_kind.setdefault(doc["kind"], {})[doc["metadata"]["name"]] = doc
    deployments = by_kind.get("Deployment", {})
    jobs = by_kind.get("Job", {})
    configmaps = by_kind.get("ConfigMap", {})
    secrets = by_kind.get("Secret", {})
    scaled = by_kind.get("ScaledObject", {})
    auths = by_kind.get("TriggerAuthentication", {})
    secret_keys: set[str] = set()

    def secret_ref(where: str, name: str, key: str) -> None:
        if name != SECRET_NAME:
            errors.append(f"{where}: secret {name!r}, expected {SECRET_NAME!r}")
        secret_keys.add(key)

    for name, doc in {**deployments, **jobs}.items():
        where = f"{doc['kind']}/{name}"
        pod = _pod_spec(doc)
        pod_sc = pod.get("securityContext", {})
        if pod_sc.get("runAsNonRoot") is not True or not pod_sc.get("runAsUser"):
            errors.append(f"{where}: pod must set runAsNonRoot and a non-zero runAsUser")
        if pod_sc.get("seccompProfile", {}).get("type") != "RuntimeDefault":
            errors.append(f"{where}: pod seccompProfile must be RuntimeDefault")
        if pod.get("automountServiceAccountToken") is not False:
            errors.append(f"{where}: automountServiceAccountToken must be false")
        drain = DEFAULT_DRAIN_TIMEOUT
        for container in _containers(doc):
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
            if not _image_tagged(container["image"]):
                errors.append(f"{cwhere}: image {container['image']!r} needs a tag, not latest")
            settings: dict[str, str] = {}
            for source in container.get("envFrom", []):
                ref = source.get("configMapRef", {}).get("name")
                if ref is not None and ref not in configmaps:
                    errors.append(f"{cwhere}: envFrom ConfigMap {ref!r} is not rendered")
                elif ref is not None:
                    settings.update(configmaps[ref].get("data", {}))
                if "secretRef" in source:
                    errors.append(f"{cwhere}: secrets go in env by key, not envFrom")
            for env in container.get("env", []):
                key_ref = env.get("valueFrom", {}).get("secretKeyRef")
                if key_ref:
                    secret_ref(cwhere, key_ref["name"], key_ref["key"])
                elif env["name"] in ("PKGQ_POSTGRES_DSN", "PKGQ_AMQP_URL"):
                    errors.append(f"{cwhere}: {env['name']} must come from the Secret")
                elif "value" in env:
                    settings[env["name"]] = env["value"]
            drain = max(drain, float(settings.get("PKGQ_DRAIN_TIMEOUT", DEFAULT_DRAIN_TIMEOUT)))
            if doc["kind"] != "Deployment":
                continue
            port = int(settings.get("PKGQ_HTTP_PORT", "0"))
            # pkgq binds the status port to 127.0.0.1 unless told otherwise, out of the
            # kubelet's reach: its probes would fail and every pod would be restarted.
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
        grace = pod.get("terminationGracePeriodSeconds", 30)
        if grace <= drain:
            errors.append(
                f"{where}: terminationGracePeriodSeconds {grace} must exceed the drain {drain}"
            )
        if doc["kind"] == "Deployment":
            labels = doc["spec"]["template"]["metadata"].get("labels", {})
            if not _selects(doc["spec"]["selector"]["matchLabels"], labels):
                errors.append(f"{where}: selector does not match the pod template's labels")

    for name, doc in auths.items():
        for ref in doc["spec"].get("secretTargetRef", []):
            secret_ref(f"TriggerAuthentication/{name}", ref["name"], ref["key"])
    if secrets:
        data = {**secrets.get(SECRET_NAME, {}).get("data", {})}
        data.update(secrets.get(SECRET_NAME, {}).get("stringData", {}))
        for key in sorted(secret_keys - set(data)):
            errors.append(f"Secret/{SECRET_NAME}: no key {key!r}, which is referenced")

    for name, doc in by_kind.get("PodDisruptionBudget", {}).items():
        selector = doc["spec"]["selector"]["matchLabels"]
        matched = [
            d
            for d in deployments
            if _selects(selector, deployments[d]["spec"]["template"]["metadata"]["labels"])
        ]
        if len(matched) != 1:
            errors.append(f"PodDisruptionBudget/{name}: selects {len(matched)} Deployments")
    pdb_covered = {
        d
        for d in deployments
        for pdb in by_kind.get("PodDisruptionBudget", {}).values()
        if _selects(
            pdb["spec"]["selector"]["matchLabels"],
            deployments[d]["spec"]["template"]["metadata"]["labels"],
        )
    }
    for name in sorted(set(deployments) - pdb_covered):
        errors.append(f"Deployment/{name}: no PodDisruptionBudget")

    scaled_targets: dict[str, str] = {}
    for name, doc in scaled.items():
        spec = doc["spec"]
        target = spec["scaleTargetRef"]
        if target.get("kind", "Deployment") != "Deployment" or target["name"] not in deployments:
            errors.append(f"ScaledObject/{name}: target {target['name']!r} is not a Deployment")
        for trigger in spec["triggers"]:
            meta = trigger["metadata"]
            if trigger["type"] != "rabbitmq" or meta.get("mode") != "QueueLength":
                errors.append(f"ScaledObject/{name}: trigger must be rabbitmq, mode QueueLength")
            if "host" in meta or "hostFromEnv" in meta:
                errors.append(f"ScaledObject/{name}: the broker URL belongs in the auth ref")
            auth = trigger.get("authenticationRef", {})
            if auth.get("kind", "TriggerAuthentication") != "TriggerAuthentication" or (
                auth.get("name") not in auths
            ):
                errors.append(f"ScaledObject/{name}: authenticationRef does not resolve")
            scaled_targets[meta.get("queueName", "")] = target["name"]
        if spec.get("minReplicaCount", 0) < 1:
            errors.append(f"ScaledObject/{name}: minReplicaCount must keep a consumer running")
        if deployments.get(target["name"], {}).get("spec", {}).get("replicas") is not None:
            errors.append(f"Deployment/{target['name']}: sets replicas, but KEDA scales it")

    args = {
        name: _pod_spec(doc)["containers"][0].get("args", []) for name, doc in deployments.items()
    }
    for queue in queues:
        route = queue.split(".", 2)[-1]
        target = scaled_targets.get(queue)
        if target is None:
            errors.append(f"queue {queue}: no ScaledObject")
        elif args.get(target) != ["run", route, "--no-ingest"]:
            errors.append(f"queue {queue}: {target} runs {args.get(target)}, not run {route}")
    for needed in (["relay"], ["dlq", "ingest"]):
        if sum(1 for a in args.values() if a == needed) != 1:
            errors.append(f"need exactly one Deployment running `pkgq {' '.join(needed)}`")
    migrate = [n for n, d in jobs.items() if _pod_spec(d)["containers"][0]["args"] == ["migrate"]]
    if len(migrate) != 1:
        errors.append("need exactly one Job running `pkgq migrate`")
    return errors


def commands(docs: list[Doc]) -> set[tuple[str, ...]]:
    """The distinct `pkgq ...` command lines the manifests run (verify.sh asks pkgq about them)."""
    out: set[tuple[str, ...]] = set()
    for doc in docs:
        if doc["kind"] in ("Deployment", "Job"):
            for container in _containers(doc):
                out.add((*container.get("command", []), *container.get("args", [])))
    return out


# --- 3. self-tests --------------------------------------------------------------------------


def _first(docs: list[Doc], kind: str, pick: str = "") -> tuple[int, Doc]:
    for index, doc in enumerate(docs):
        if doc["kind"] == kind and pick in doc["metadata"]["name"]:
            return index, copy.deepcopy(doc)
    raise LookupError(kind)


SELF_TESTS = 10


def self_tests(
    docs: list[Doc], checker: Checker, queues: list[str], max_message_size: int, pkgq: Doc
) -> Iterator[str]:
    """Yield a description of each of the SELF_TESTS deliberately broken documents that the
    checks failed to reject."""
    i, doc = _first(docs, "Deployment", "usage-record")
    doc["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["memory"] = "128Mi"
    if not memory_errors([*docs[:i], doc, *docs[i + 1 :]], max_message_size, pkgq):
        yield "a consumer pod with no room for its prefetch passed the memory check"
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
    doc["spec"]["template"]["spec"]["containers"][0]["livenessProbes"] = {}
    if not checker.schema_errors(doc):
        yield "Deployment with a container's livenessProbes passed the Kubernetes schema"
    i, doc = _first(docs, "PodDisruptionBudget")
    doc["spec"]["maxUnavailabel"] = 1
    if not checker.schema_errors(doc):
        yield "PodDisruptionBudget with spec.maxUnavailabel passed the Kubernetes schema"
    i, doc = _first(docs, "Deployment", "relay")
    doc["spec"]["template"]["spec"]["containers"][0]["securityContext"].pop(
        "readOnlyRootFilesystem"
    )
    doc["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = 30
    broken = [*docs[:i], doc, *docs[i + 1 :]]
    found = rule_errors(broken, queues)
    if not any("readOnlyRootFilesystem" in e for e in found):
        yield "a writable root filesystem passed pkgq's rules"
    if not any("terminationGracePeriodSeconds" in e for e in found):
        yield "a grace period equal to the drain passed pkgq's rules"
    i, doc = _first(docs, "ConfigMap")
    doc["data"].pop("PKGQ_HTTP_HOST")
    if not any(
        "PKGQ_HTTP_HOST" in e for e in rule_errors([*docs[:i], doc, *docs[i + 1 :]], queues)
    ):
        yield "a status port left on loopback passed pkgq's rules"
    i, doc = _first(docs, "ScaledObject")
    doc["spec"]["triggers"][0]["metadata"]["queueName"] = "pkgq.telecom.nowhere"
    if not rule_errors([*docs[:i], doc, *docs[i + 1 :]], queues):
        yield "a ScaledObject on the wrong queue passed pkgq's rules"


# --- the Dockerfile -------------------------------------------------------------------------


def dockerfile_errors(repo: Path) -> list[str]:
    errors: list[str] = []
    text = (repo / "Dockerfile").read_text()
    logical = re.sub(r"\\\n", " ", text)
    lines = [ln.strip() for ln in logical.splitlines() if ln.strip() and not ln.startswith("#")]
    args = dict(
        re.match(r"ARG\s+(\w+)=(\S+)", ln).groups()  # type: ignore[union-attr]
        for ln in lines
        if re.match(r"ARG\s+\w+=\S+", ln)
    )
    stages = [ln for ln in lines if ln.upper().startswith("FROM ")]
    if len(stages) < 2:
        errors.append("Dockerfile: not multi-stage")
    for stage in stages:
        image = stage.split()[1]
        image = re.sub(r"\$\{?(\w+)\}?", lambda m: args.get(m.group(1), m.group(0)), image)
        if not _image_tagged(image):
            errors.append(f"Dockerfile: base image {image!r} needs a tag, not latest")
    final = lines[lines.index(stages[-1]) :] if stages else []
    users = [ln.split()[1] for ln in final if ln.upper().startswith("USER ")]
    uid = users[-1].split(":")[0] if users else ""
    if not uid.isdigit() or int(uid) == 0:
        errors.append("Dockerfile: the final stage must end with a numeric non-root USER")
    if not any("--from=" in ln for ln in final if ln.upper().startswith("COPY")):
        errors.append("Dockerfile: the final stage must copy the built venv from a build stage")
    installs = [ln for ln in lines if "pip install" in ln and "-c constraints.txt" in ln]
    if not installs:
        errors.append("Dockerfile: pkgq must be installed with `pip install -c constraints.txt`")
    for line in installs:
        if re.search(r"\s-e\s|--editable|\[dev\]", line):
            errors.append("Dockerfile: the image install must be non-editable, without [dev]")
    if any(re.search(r"(pip install.*(pytest|mypy|ruff))", ln) for ln in lines):
        errors.append("Dockerfile: dev tools must stay out of the image")

    # The build context .dockerignore lets through must hold what `pip install .` reads.
    patterns = [
        ln.strip()
        for ln in (repo / ".dockerignore").read_text().splitlines()
        if ln.strip() and not ln.startswith("#")
    ]
    project = tomllib.loads((repo / "pyproject.toml").read_text())
    needed = {"pyproject.toml", "constraints.txt", project["project"]["readme"]}
    for pattern in project["tool"]["setuptools"]["packages"]["find"]["include"]:
        needed.add(pattern.rstrip("*") + "/")
    if patterns[:1] != ["*"]:
        errors.append(".dockerignore: must start with `*` (allow-list the build context)")
    for path in sorted(needed - {p.removeprefix("!") for p in patterns if p.startswith("!")}):
        errors.append(f".dockerignore: {path} is needed by the build but not let in")
    return errors


# --- main -----------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", type=Path, required=True)
    parser.add_argument("--k8s-version", required=True)
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
    queues = route_queues(opts.repo / "deploy/rabbitmq/definitions.json")
    max_message_size = broker_max_message_size(opts.repo / "deploy/rabbitmq/rabbitmq.conf")
    pkgq_defaults = json.loads(opts.pkgq_defaults.read_text())
    failures: list[str] = []
    counts: list[str] = []
    all_commands: set[tuple[str, ...]] = set()
    first_docs: list[Doc] | None = None
    for item in opts.rendered:
        overlay, _, filename = item.partition("=")
        docs = [d for d in yaml.safe_load_all(Path(filename).read_text()) if d]
        first_docs = first_docs or docs
        keda = 0
        for doc in docs:
            name = f"{overlay}: {doc.get('kind')}/{doc.get('metadata', {}).get('name')}"
            failures += [f"{name}: {e}" for e in checker.schema_errors(doc)]
            keda += doc.get("apiVersion") == KEDA_GROUP
        failures += [f"{overlay}: {e}" for e in rule_errors(docs, queues)]
        failures += [
            f"{overlay}: {e}" for e in memory_errors(docs, max_message_size, pkgq_defaults)
        ]
        all_commands |= commands(docs)
        counts.append(f"{overlay} {len(docs)} documents ({keda} KEDA)")
    assert first_docs is not None
    missed = list(self_tests(first_docs, checker, queues, max_message_size, pkgq_defaults))
    failures += [f"self-test: {m}" for m in missed]
    failures += dockerfile_errors(opts.repo)
    if opts.commands_out:
        opts.commands_out.write_text("".join(" ".join(c) + "\n" for c in sorted(all_commands)))
    for failure in failures:
        print(failure, file=sys.stderr)
    if failures:
        return 1
    print(
        f"{', '.join(counts)}: strict against Kubernetes {opts.k8s_version} and KEDA "
        f"{dist_version('cloudcoil.models.keda')} schemas, {len(queues)} route queues covered, "
        f"{SELF_TESTS} broken variants rejected, every pod's memory limit holds its in-flight "
        f"bodies at max_message_size {max_message_size // 1024} KiB; Dockerfile rules ok"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
