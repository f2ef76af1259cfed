#!/usr/bin/env bash
# Check deploy/k8s and the Dockerfile, offline once its tools are installed:
# - render both overlays with `kubectl kustomize` (kustomize built into kubectl);
# - check that each overlay's rabbitmq-definitions.json is what this pkgq makes with its ConfigMap;
# - validate every rendered document strictly (unknown fields are errors): built-in kinds against
#   Kubernetes' OpenAPI schemas, KEDA's ScaledObject/TriggerAuthentication against schemas
#   generated from KEDA's CRDs, prod's RabbitmqCluster and CloudNativePG Cluster against their
#   operators' released CRD schemas (tools/crds/); then pkgq's own rules, and self-tests that
#   broken documents fail (deploy/k8s/tools/validate.py says what exactly);
# - ask this checkout's pkgq whether it accepts every command line the manifests run;
# - lint the Dockerfile with hadolint (it cannot be built here: no container engine).
# The tools come from PyPI, pinned in deploy/k8s/tools/requirements.txt, into their own
# virtualenv .venv/k8s-tools (installed on the first run and whenever that file changes).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
pkgq="$repo/.venv/bin/pkgq"
tools="$repo/.venv/k8s-tools"
reqs="$here/tools/requirements.txt"
k8s_version=1.37.0 # the newest Kubernetes whose schemas kubernetes-validate 1.37.0 bundles

[ -x "$pkgq" ] || { echo "$pkgq is missing: run 'make venv' first" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

want=$(sha256sum "$reqs" | cut -d' ' -f1)
if [ "$(cat "$tools/.installed" 2>/dev/null)" != "$want" ]; then
    echo "k8s verify: installing its tools from PyPI into $tools" >&2
    rm -rf "$tools"
    # With the project's uv (deploy/local/ensure-venv.sh) when it is there and can (3 s against
    # 17), else with pip.
    uv=("$repo/.venv/bin/uv" pip install -q --python "$tools/bin/python" --compile-bytecode)
    pip=("$tools/bin/python" -m pip install -q --disable-pip-version-check --no-input)
    if ! { "$repo/.venv/bin/python" -m venv "$tools" \
        && { { [ -x "${uv[0]}" ] && "${uv[@]}" -r "$reqs"; } || "${pip[@]}" -r "$reqs"; }; } \
        >"$work/install.log" 2>&1; then
        cat "$work/install.log" >&2
        echo "k8s verify: could not install the tools pinned in $reqs into $tools" \
            "(PyPI must be reachable on the first run); nothing was checked" >&2
        rm -rf "$tools"
        exit 1
    fi
    echo "$want" >"$tools/.installed"
fi

# Render. KUBECONFIG=/dev/null: rendering never needs, nor may touch, a cluster.
for overlay in dev prod; do
    KUBECONFIG=/dev/null "$tools/bin/kubectl" kustomize "$here/overlays/$overlay" \
        >"$work/$overlay.yaml" 2>"$work/$overlay.err" \
        || { echo "kustomize failed on overlays/$overlay:" >&2; cat "$work/$overlay.err" >&2
            exit 1; }
done

# The broker definitions each overlay runs with (PKGQ_DECLARE_TOPOLOGY=false: pkgq only checks
# the topology) must be exactly what this pkgq makes with that overlay's ConfigMap: dev's
# (classic queues) in deploy/k8s/, prod's (PKGQ_QUEUE_TYPE=quorum) beside its overlay. pkgq runs
# with the ConfigMap's settings and no other PKGQ_* variable of this shell.
declare -A definitions=(
    [dev]="$here/rabbitmq-definitions.json"
    [prod]="$here/overlays/prod/rabbitmq-definitions.json"
)
for overlay in dev prod; do
    "$tools/bin/python" - "$work/$overlay.yaml" "$pkgq" "$work/$overlay.definitions.json" \
        "$work/$overlay.settings" <<'PY' || exit 1
import os, shlex, subprocess, sys, yaml
rendered, pkgq, out, settings_out = sys.argv[1:5]
maps = [
    doc["data"]
    for doc in yaml.safe_load_all(open(rendered))
    if doc and doc["kind"] == "ConfigMap" and doc["metadata"]["name"].startswith("pkgq-config")
]
if len(maps) != 1:
    sys.exit(f"{rendered}: expected one pkgq-config ConfigMap, found {len(maps)}")
env = {k: v for k, v in os.environ.items() if not k.startswith("PKGQ_")}
env.update(maps[0])
with open(out, "w") as stream:
    subprocess.run([pkgq, "definitions"], env=env, stdout=stream, check=True)
with open(settings_out, "w") as stream:
    stream.write(" ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(maps[0].items())))
PY
    diff -u "${definitions[$overlay]}" "$work/$overlay.definitions.json" \
        >"$work/$overlay.definitions.diff" || {
        echo "${definitions[$overlay]} is not what pkgq makes with overlays/$overlay's" \
            "ConfigMap; regenerate it:" >&2
        echo "  env $(cat "$work/$overlay.settings") .venv/bin/pkgq definitions >" \
            "${definitions[$overlay]#"$repo/"}" >&2
        head -40 "$work/$overlay.definitions.diff" >&2
        exit 1
    }
done

# The memory check's defaults come from pkgq's own code, so they cannot drift from it.
(cd "$repo" && "$repo/.venv/bin/python" -c '
import json
from events.routes import ROUTES
from infra.outbox.relay import ROUNDS_IN_FLIGHT
from infra.settings import Settings
from consumers.web.config import WebSettings
fields = Settings.model_fields
print(json.dumps({
    "prefetch": fields["prefetch"].default,
    "batch_size": fields["batch_size"].default,
    "batch_max": fields["batch_max"].default,
    "relay_batch_size": fields["relay_batch_size"].default,
    "relay_rounds": ROUNDS_IN_FLIGHT,
    "pool_max_size": fields["pool_max_size"].default,
    "web_pool_max_size": WebSettings.model_fields["pool_max_size"].default,
    "routes": sorted(ROUTES),
}))') >"$work/pkgq-defaults.json"
summary=$("$tools/bin/python" "$here/tools/validate.py" --repo "$repo" \
    --k8s-version "$k8s_version" --commands-out "$work/commands" \
    --definitions "dev=${definitions[dev]}" --definitions "prod=${definitions[prod]}" \
    --pkgq-defaults "$work/pkgq-defaults.json" \
    "dev=$work/dev.yaml" "prod=$work/prod.yaml")

# Every command line in the manifests must parse: `pkgq ARGS --help` fails on an unknown
# subcommand or option (route names are checked against definitions.json by validate.py). One
# interpreter runs pkgq's entry point for each line in turn (a fresh one each cost about 1.2
# CPU s, 13 lines), with nothing but the installed packages on its path (-P); a line passes only
# if that exits 0. The same interpreter first proves the check bites: a line with an unknown
# option must not pass.
i=$(grep -c . "$work/commands" || true)
"$repo/.venv/bin/python" -P - "$work/commands" <<'PY' || exit 1
import contextlib, io, sys, traceback
from consumers.cli import main

def status(words: list[str]) -> tuple[int, str]:
    """pkgq's exit status for `pkgq WORDS --help`, and what it wrote to stderr."""
    sys.argv = ["pkgq", *words, "--help"]
    out, err = io.StringIO(), io.StringIO()
    code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main()
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        except Exception:  # noqa: BLE001  (a crash is this line's failure; the next is checked)
            traceback.print_exc(file=err)
            code = 1
    return code, err.getvalue()

lines = open(sys.argv[1]).read().splitlines()  # before status() sets sys.argv
if status(["run", "usage_record", "--no-such-option"])[0] == 0:
    sys.exit("k8s verify: the command-line check passed an unknown option")
failed = False
for line in lines:
    if not line.strip():
        continue
    cmd = line.split()  # as the manifests list it: words split on blanks
    if cmd[0] != "pkgq":
        sys.exit(f"manifests run {cmd[0]!r}, not pkgq")
    code, err = status(cmd[1:])
    if code != 0:
        print(f"pkgq does not accept: {line} (exit {code})\n{err}", file=sys.stderr)
        failed = True
sys.exit(1 if failed else 0)
PY

# The Dockerfile: hadolint at its strictest threshold, after proving it rejects a bad one.
printf 'FROM python:latest\nRUN pip install pkgq\nUSER root\n' >"$work/Dockerfile.bad"
if "$tools/bin/hadolint" --no-color "$work/Dockerfile.bad" >/dev/null 2>&1; then
    echo "hadolint passed a Dockerfile it must reject" >&2
    exit 1
fi
"$tools/bin/hadolint" --no-color --failure-threshold info "$repo/Dockerfile" >&2

echo "k8s manifests verified: $summary; $i pkgq command lines accepted by pkgq;" \
    "Dockerfile passes hadolint $("$tools/bin/hadolint" --version | awk '{print $NF}')"
