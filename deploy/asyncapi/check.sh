#!/usr/bin/env bash
# Validate pkgq's AsyncAPI document with the official AsyncAPI parser from the npm registry
# (@asyncapi/parser, exact version in package.json), in `make check`:
# - installs it into deploy/asyncapi/node_modules (git-ignored) with `npm install
#   --no-package-lock` on the first run and whenever package.json changes;
# - validates docs/asyncapi.json and what this checkout's `pkgq asyncapi` prints (the unit tests
#   keep the two identical), failing on any error or warning (validate.mjs);
# - proves the check bites: a copy with an unknown server field must be rejected.
# Needs Node.js 18+ and npm (Debian: apt-get install nodejs npm).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
pkgq="$repo/.venv/bin/pkgq"
[ -x "$pkgq" ] || { echo "$pkgq is missing: run 'make venv' first" >&2; exit 1; }
command -v node >/dev/null && command -v npm >/dev/null || {
    echo "asyncapi check: node and npm are needed: apt-get install -y nodejs npm" >&2
    exit 1
}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

want=$(sha256sum "$here/package.json" | cut -d' ' -f1)
stamp="$here/node_modules/.pkgq-installed"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    echo "asyncapi check: installing the parser from the npm registry into $here/node_modules" >&2
    rm -rf "$here/node_modules"
    if ! (cd "$here" && npm install --no-package-lock --no-audit --no-fund --ignore-scripts \
        --loglevel=error) >"$work/npm.log" 2>&1; then
        cat "$work/npm.log" >&2
        echo "asyncapi check: npm install failed (the registry must be reachable on the first run)" >&2
        rm -rf "$here/node_modules"
        exit 1
    fi
    echo "$want" >"$stamp"
fi

"$pkgq" asyncapi >"$work/generated.json"
node "$here/validate.mjs" "$repo/docs/asyncapi.json" 2>"$work/committed.err" >"$work/summary" \
    || { cat "$work/committed.err" >&2; exit 1; }
node "$here/validate.mjs" "$work/generated.json" 2>"$work/generated.err" >/dev/null \
    || { cat "$work/generated.err" >&2; exit 1; }
python3 - "$work/generated.json" "$work/broken.json" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
doc["servers"]["amqp"]["protocoll"] = "amqp"
json.dump(doc, open(sys.argv[2], "w"))
PY
if node "$here/validate.mjs" "$work/broken.json" >/dev/null 2>&1; then
    echo "asyncapi check: the parser accepted a document with an unknown server field" >&2
    exit 1
fi
echo "asyncapi verified by @asyncapi/parser $(node -p "require('$here/node_modules/@asyncapi/parser/package.json').version"): $(cat "$work/summary")"
