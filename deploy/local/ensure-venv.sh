#!/usr/bin/env bash
# Create the project's virtualenv ($1, default .venv) and install pkgq with pinned dependencies.
set -euo pipefail
venv=${1:-.venv}
py=${PYTHON:-python3}

command -v "$py" >/dev/null 2>&1 || { echo "ensure-venv: $py not found: install Python 3.11+ (Debian: apt-get install python3 python3-venv)" >&2; exit 1; }
"$py" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
    || { echo "ensure-venv: pkgq needs Python 3.11+, $py is $("$py" -V 2>&1)" >&2; exit 1; }

if [ ! -x "$venv/bin/python" ]; then
    if ! "$py" -m venv "$venv" 2>/dev/null; then
        rm -rf "$venv"
        if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
            echo "ensure-venv: installing python3-venv from Debian's packages" >&2
            DEBIAN_FRONTEND=noninteractive apt-get update -qq
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
            "$py" -m venv "$venv"
        else
            echo "ensure-venv: '$py -m venv' failed: run 'sudo apt-get install python3-venv' and try again" >&2
            exit 1
        fi
    fi
fi
# pip 23.2 or newer (tests/support/releases.py runs `pip --python`): upgraded only if older.
if ! "$venv/bin/python" -c 'import sys, pip; sys.exit(tuple(map(int, pip.__version__.split(".")[:2])) < (23, 2))'; then
    "$venv/bin/python" -m pip install -q --disable-pip-version-check --upgrade 'pip>=23.2'
fi
# uv (pinned in constraints.txt, from PyPI) installs the same pins in about 10 s where pip takes
# about 40 (both byte-compiling, as pip does by default). uv reads none of pip's configuration
# (pip.conf, PIP_* variables): where it cannot install uv, or uv cannot install (say, only a
# mirror that pip is configured for is reachable), pip does it all.
pip=("$venv/bin/python" -m pip install -q --disable-pip-version-check)
if ! { "${pip[@]}" --only-binary uv -c constraints.txt uv \
    && "$venv/bin/uv" pip install -q --python "$venv/bin/python" --compile-bytecode \
        -c constraints.txt -e '.[dev]'; }; then
    echo "ensure-venv: uv could not install pkgq (above); installing with pip" >&2
    "${pip[@]}" -c constraints.txt -e '.[dev]'
fi
