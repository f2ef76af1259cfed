"""Write the schema of one version of an upstream CustomResourceDefinition as the JSON file that
deploy/k8s/tools/schemas.py validates against (see README.md beside this file).

    python extract.py UPSTREAM_CRD.yaml VERSION SOURCE > OUT.json

UPSTREAM_CRD.yaml is the operator's CRD file exactly as released (e.g. `git show
v1.30.0:config/crd/bases/postgresql.cnpg.io_clusters.yaml` in cloudnative-pg/cloudnative-pg);
SOURCE says where it came from (repository, tag, commit, path), and is recorded in the output
with the file's sha256. The only change made to the schema is that every `description` (the
field documentation, most of the file) is left out: types, enums, patterns, bounds, required
fields, defaults and the x-kubernetes-* markers are kept as upstream wrote them.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import yaml

SUBSCHEMA_LISTS = ("allOf", "anyOf", "oneOf")


def without_descriptions(schema: Any) -> Any:
    """The schema without `description` keywords; a property that happens to be named
    `description` (a key of `properties`) is kept."""
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "description":
            continue
        if key == "properties":
            out[key] = {name: without_descriptions(sub) for name, sub in value.items()}
        elif key in ("items", "additionalProperties", "not") and isinstance(value, dict):
            out[key] = without_descriptions(value)
        elif key in SUBSCHEMA_LISTS:
            out[key] = [without_descriptions(sub) for sub in value]
        else:
            out[key] = value
    return out


def main() -> int:
    path, version, source = sys.argv[1:4]
    raw = Path(path).read_bytes()
    crd = yaml.safe_load(raw)
    if crd.get("kind") != "CustomResourceDefinition":
        sys.exit(f"{path}: not a CustomResourceDefinition")
    names = crd["spec"]["names"]
    found = [v for v in crd["spec"]["versions"] if v["name"] == version]
    if not found:
        sys.exit(f"{path}: no version {version}")
    document = {
        "source": source,
        "sha256": hashlib.sha256(raw).hexdigest(),
        "apiVersion": f"{crd['spec']['group']}/{version}",
        "kind": names["kind"],
        "openAPIV3Schema": without_descriptions(found[0]["schema"]["openAPIV3Schema"]),
    }
    json.dump(document, sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
