#!/usr/bin/env bash
# Make sure the Debian tools that `make check` and some tests use are installed:
# - promtool (package `prometheus`): checks and unit-tests deploy/observability's alert rules, and
#   deploy/observability/render.py runs the `prometheus` server it ships;
# - amqp-publish (package `amqp-tools`): the foreign-client test publishes with it.
# Installs what is missing with apt-get when running as root (or with password-less sudo);
# otherwise stops with a message that says what to do. The prometheus package's own service is
# not started by the install (pkgq's tools run their own servers on a free port).
set -euo pipefail

say() { printf 'ensure-tools: %s\n' "$*" >&2; }
die() { say "$*"; exit 1; }

as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; return; fi
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then sudo "$@"; return; fi
    return 1
}

missing=()
command -v promtool >/dev/null 2>&1 || missing+=(prometheus)
command -v amqp-publish >/dev/null 2>&1 || missing+=(amqp-tools)
[ "${#missing[@]}" -eq 0 ] && exit 0

command -v apt-get >/dev/null 2>&1 \
    || die "${missing[*]} missing and this is not a Debian system: install promtool and amqp-publish yourself."
say "installing ${missing[*]} from Debian's packages"
# policy-rc.d exit 101: the packages' services are not started by the install.
policy=/usr/sbin/policy-rc.d
added_policy=0
if [ "$(id -u)" -eq 0 ] && [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy" && added_policy=1
fi
cleanup() { if [ "$added_policy" = 1 ]; then rm -f "$policy"; fi; }
trap cleanup EXIT
as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq \
    && as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        "${missing[@]}" >/dev/null \
    || die "could not install ${missing[*]}: run 'sudo apt-get install ${missing[*]}' and try again."
