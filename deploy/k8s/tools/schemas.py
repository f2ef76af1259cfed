"""Layer 1 of deploy/k8s/verify.sh's checks: every rendered document against its schema, strictly
(an unknown field is an error, as with `kubectl apply`'s strict field validation).

Built-in kinds go against the Kubernetes OpenAPI schemas bundled in kubernetes-validate (its
`-strict` set); KEDA's ScaledObject and TriggerAuthentication against a JSON Schema taken from
cloudcoil-models-keda (pydantic models generated from KEDA's CRDs), made strict here:
additionalProperties false wherever properties are listed, no nulls.
"""

from __future__ import annotations

from typing import Any

import jsonschema
from kubernetes_validate import utils as kv

Doc = dict[str, Any]

KEDA_GROUP = "keda.sh/v1alpha1"


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
