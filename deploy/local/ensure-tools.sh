#!/usr/bin/env bash
# Make sure the Debian tools that `make check` and some tests use are installed:
# - promtool (package `prometheus`): checks and unit-tests deploy/observability's alert rules, and
#   deploy/observability/render.py runs the `prometheus` server it ships;
# - amqp-publish (package `amqp-tools`): the foreign-client test publishes with it;
# - chromium: the console's browser tests run it headless through Playwright (which never
#   downloads a browser of its own here);
# - wrk: the HTTP load tool of `make bench-web`;
# - haproxy: the load balancer in front of the HA lab's RabbitMQ cluster (deploy/local/ha; the
#   chaos tests), installed here so that no apt-get runs while the lab boots beside the tests;
# - curl and jq: the HA lab asks its nodes' management API whether they run and with whom;
# - iptables: the network-fault tests drop packets inside a network namespace of their own
#   (tests/support/netfault.py; iproute2's `ip` makes the namespace).
# Installs what is missing with apt-get when running as root (or with password-less sudo);
# otherwise stops with a message that says what to do. The prometheus package's own service is
# not started by the install (pkgq's tools run their own servers on a free port).
set -euo pipefail

SCRIPT=ensure-tools
# shellcheck source=deploy/local/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

missing=()
command -v promtool >/dev/null 2>&1 || missing+=(prometheus)
command -v amqp-publish >/dev/null 2>&1 || missing+=(amqp-tools)
command -v wrk >/dev/null 2>&1 || missing+=(wrk)
command -v haproxy >/dev/null 2>&1 || [ -x /usr/sbin/haproxy ] || missing+=(haproxy)
command -v curl >/dev/null 2>&1 || missing+=(curl)
command -v jq >/dev/null 2>&1 || missing+=(jq)
command -v iptables >/dev/null 2>&1 || [ -x /usr/sbin/iptables ] || missing+=(iptables)
command -v ip >/dev/null 2>&1 || [ -x /usr/sbin/ip ] || missing+=(iproute2)
browser=()
[ -x /usr/bin/chromium ] || browser+=(chromium)  # with its recommends (fonts among them)
[ "$((${#missing[@]} + ${#browser[@]}))" -eq 0 ] && exit 0

command -v apt-get >/dev/null 2>&1 \
    || die "${missing[*]} ${browser[*]} missing and this is not a Debian system: install promtool, amqp-publish, wrk, haproxy, curl, jq, iptables, iproute2 and Chromium (at /usr/bin/chromium) yourself."
say "installing ${missing[*]} ${browser[*]} from Debian's packages"
# policy-rc.d exit 101: the packages' services are not started by the install.
policy=/usr/sbin/policy-rc.d
added_policy=0
if [ "$(id -u)" -eq 0 ] && [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy" && added_policy=1
fi
cleanup() { if [ "$added_policy" = 1 ]; then rm -f "$policy"; fi; }
trap cleanup EXIT
apt() { as_root env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 "$@"; }
apt update -qq \
    && { [ "${#missing[@]}" -eq 0 ] || apt install -y -qq --no-install-recommends "${missing[@]}" >/dev/null; } \
    && { [ "${#browser[@]}" -eq 0 ] || apt install -y -qq "${browser[@]}" >/dev/null; } \
    || die "could not install ${missing[*]} ${browser[*]}: run 'sudo apt-get install ${missing[*]} ${browser[*]}' and try again."
