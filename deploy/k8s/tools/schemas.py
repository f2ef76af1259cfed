"""Layer 1 of deploy/k8s/verify.sh's checks: every rendered document against its schema, strictly
(an unknown field is an error, as with `kubectl apply`'s strict field validation).

Built-in kinds go against the Kubernetes OpenAPI schemas bundled in kubernetes-validate (its
`-strict` set); KEDA's ScaledObject and TriggerAuthentication against a JSON Schema taken from
cloudcoil-models-keda (pydantic models generated from KEDA's CRDs), made strict here:
additionalProperties false wherever properties are listed, no nulls. The operators' resources
of the prod overlay (RabbitmqCluster, CloudNativePG's Cluster) against the openAPIV3Schema of
their released CRDs, kept in crds/ (crds/README.md says which release), read the way the API
server reads a structural schema: a field the schema does not list is unknown (an error) unless
the node preserves unknown fields, `nullable` admits null, list-type set/map items are unique;
their metadata against Kubernetes' ObjectMeta. CEL rules (x-kubernetes-validations) and the
operators' admission webhooks are not run here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
from kubernetes_validate import utils as kv

Doc = dict[str, Any]

KEDA_GROUP = "keda.sh/v1alpha1"
CRD_DIR = Path(__file__).parent / "crds"
"""One JSON file per operator resource: crds/README.md."""


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


def _structural(node: Any) -> Any:
    """A CRD's structural schema (OpenAPI v3) as the JSON Schema the API server enforces with
    strict field validation."""
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "properties":
            out[key] = {name: _structural(sub) for name, sub in value.items()}
        elif key in ("items", "additionalProperties", "not") and isinstance(value, dict):
            out[key] = _structural(value)
        elif key in ("allOf", "anyOf", "oneOf"):
            out[key] = [_structural(sub) for sub in value]
        elif key != "default":
            out[key] = value
    if out.get("nullable") is True and isinstance(out.get("type"), str):
        out["type"] = [out["type"], "null"]
    preserves = out.get("x-kubernetes-preserve-unknown-fields") is True
    if out.get("type") == "object" and "additionalProperties" not in out and not preserves:
        # Unlisted fields are pruned by the API server, and reported as unknown under strict
        # field validation: an object with no properties at all keeps none.
        out["additionalProperties"] = False
    if out.get("x-kubernetes-list-type") == "set":
        out["uniqueItems"] = True
    return out


def _unique_map_keys(validator: Any, keys: list[str], instance: Any, schema: dict[str, Any]) -> Any:
    """x-kubernetes-list-type: map: no two items with the same values of the map keys."""
    if not validator.is_type(instance, "array"):
        return
    seen: set[str] = set()
    for item in instance:
        if not isinstance(item, dict):
            continue
        values = [item.get(k) for k in keys]
        key = json.dumps(values)
        if key in seen:
            named = dict(zip(keys, values, strict=True))
            yield jsonschema.ValidationError(f"duplicate list-map item {named}")
        seen.add(key)


_CrdValidator = jsonschema.validators.extend(
    jsonschema.Draft202012Validator, {"x-kubernetes-list-map-keys": _unique_map_keys}
)


def crd_validators(directory: Path = CRD_DIR) -> dict[tuple[str, str], Any]:
    """(apiVersion, kind) -> a validator of the resource's schema, metadata left to ObjectMeta."""
    validators: dict[tuple[str, str], Any] = {}
    for path in sorted(directory.glob("*.json")):
        crd = json.loads(path.read_text())
        schema = _structural(crd["openAPIV3Schema"])
        schema["properties"]["metadata"] = {"type": "object"}
        schema["required"] = sorted({"apiVersion", "kind", "metadata", "spec"})
        schema["properties"]["apiVersion"] = {"const": crd["apiVersion"]}
        schema["properties"]["kind"] = {"const": crd["kind"]}
        _CrdValidator.check_schema(schema)
        validators[(crd["apiVersion"], crd["kind"])] = _CrdValidator(schema)
    return validators


def _path(parts: Any) -> str:
    return ".".join(str(part) for part in parts) or "(document)"


class Checker:
    def __init__(self, k8s_version: str) -> None:
        self.k8s_version = k8s_version
        self.keda = keda_validators()
        self.crds = crd_validators()

    def crd_versions(self) -> list[str]:
        """Where the operators' schemas come from, for the summary line."""
        found = []
        for path in sorted(CRD_DIR.glob("*.json")):
            crd = json.loads(path.read_text())
            found.append(f"{crd['kind']} {crd['source'].split(' (')[0].split('/')[-1]}")
        return found

    def schema_errors(self, doc: Doc) -> list[str]:
        kind = doc.get("kind", "?")
        crd = self.crds.get((doc.get("apiVersion", ""), kind))
        if crd is not None:
            errors = [
                f"{_path(error.absolute_path)}: {error.message}"
                for error in sorted(crd.iter_errors(doc), key=lambda e: list(e.path))
            ]
            # The API server checks a custom resource's metadata as ObjectMeta.
            meta = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": doc.get("metadata")}
            try:
                kv.validate(meta, self.k8s_version, strict=True)
            except kv.ValidationError as error:
                errors.append(f"{_path(error.path)}: {error.message}")
            if not doc.get("metadata", {}).get("name"):
                errors.append("metadata.name: required")
            return errors
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
