#!/usr/bin/env bash
# The system tools the console's browser tests and its benchmark drive: Debian's Chromium (run
# headless by Playwright, which never downloads a browser of its own here) and wrk (the HTTP load
# tool of `make bench-web`). Installs the missing ones with apt-get when running as root (or
# with passwordless sudo); otherwise says exactly what to run.
set -euo pipefail

say() { printf 'ensure-web-tools: %s\n' "$*" >&2; }
die() { say "$*"; exit 1; }

as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; return; fi
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then sudo "$@"; return; fi
    return 1
}

missing=()
[ -x /usr/bin/chromium ] || missing+=(chromium)
command -v wrk >/dev/null 2>&1 || missing+=(wrk)
[ ${#missing[@]} -eq 0 ] && exit 0

command -v apt-get >/dev/null 2>&1 \
    || die "${missing[*]} missing and this is not a Debian system: install them yourself (Chromium at /usr/bin/chromium)."
say "installing ${missing[*]} from Debian's packages"
as_root env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 update -qq \
    && as_root env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq "${missing[@]}" >/dev/null \
    || die "could not install ${missing[*]}: run 'sudo apt-get install -y ${missing[*]}' and try again."
