#!/usr/bin/env bash
# Make sure PostgreSQL and RabbitMQ are running on this machine, for `make demo` and `make test`.
# Starts them if stopped; installs them from Debian's packages if missing and running as root;
# otherwise stops with a message that says what to do.
set -euo pipefail

SCRIPT=ensure-services
# shellcheck source=deploy/local/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

apt_install() {
    command -v apt-get >/dev/null 2>&1 || die "$1 is missing and this is not a Debian system: install $1 yourself."
    say "installing $* from Debian's packages"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq \
        && as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null \
        || die "could not install $*: run 'sudo apt-get install $*' and try again."
}

pg_ready() { pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null; }

ensure_postgres() {
    if ! command -v pg_ctlcluster >/dev/null 2>&1; then
        apt_install postgresql
    fi
    if pg_ready; then return; fi
    local version
    version=$(ls /etc/postgresql 2>/dev/null | sort -V | tail -n 1)
    [ -n "$version" ] || die "PostgreSQL is installed but has no cluster: run 'sudo pg_createcluster --start 15 main'."
    say "starting PostgreSQL $version"
    as_root pg_ctlcluster --skip-systemctl-redirect "$version" main start \
        || die "could not start PostgreSQL: run 'sudo pg_ctlcluster $version main start'."
    for _ in $(seq 1 30); do pg_ready && return; sleep 1; done
    die "PostgreSQL did not accept connections on 127.0.0.1:5432 within 30 s; see /var/log/postgresql/."
}

ensure_postgres_access() {
    # The setup connects as the postgres role over TCP to create pkgq's roles, and pkgq's roles
    # connect over TCP too. A fresh Debian install wants a password there; trust on loopback is
    # what a dev box and CI use.
    if psql -h 127.0.0.1 -U postgres -d postgres -Atqc 'select 1' >/dev/null 2>&1; then return; fi
    if [ -n "${PKGQ_POSTGRES_DSN:-}" ]; then return; fi
    die "cannot connect as postgres@127.0.0.1 without a password. Either set PKGQ_POSTGRES_DSN to a DSN that works, or allow trust on loopback for local development."
}

ensure_postgres_roles() {
    # pkgq migrates as pkgq_owner and runs as pkgq_runtime (README, Roles). Create them, and hand
    # a pkgq database made before roles existed to the owner. Skipped when PKGQ_POSTGRES_DSN is
    # set: that deployment manages its own roles.
    if [ -n "${PKGQ_POSTGRES_DSN:-}" ]; then return; fi
    local here psql_admin
    here=$(dirname "$0")
    psql_admin=(psql -h 127.0.0.1 -U postgres -v ON_ERROR_STOP=1 -qAt -v owner=pkgq_owner)
    "${psql_admin[@]}" -d postgres -v runtime=pkgq_runtime -v db=pkgq -f "$here/roles.sql" >/dev/null \
        || die "could not create the roles pkgq_owner and pkgq_runtime (deploy/local/roles.sql)."
    if "${psql_admin[@]}" -d postgres -c "select 1 from pg_database where datname = 'pkgq'" | grep -q 1; then
        "${psql_admin[@]}" -d pkgq -f "$here/handover.sql" >/dev/null \
            || die "could not hand the pkgq database to pkgq_owner (deploy/local/handover.sql)."
    fi
}

rabbit_ready() { rabbitmqctl -q await_startup --timeout 5 >/dev/null 2>&1; }

ensure_rabbitmq() {
    if ! command -v rabbitmq-server >/dev/null 2>&1; then
        apt_install rabbitmq-server
    fi
    if rabbit_ready; then return; fi
    say "starting RabbitMQ"
    as_root rabbitmq-server -detached >/dev/null 2>&1 || true
    for _ in $(seq 1 60); do rabbit_ready && return; sleep 1; done
    die "RabbitMQ did not start within 60 s: run 'sudo rabbitmq-server -detached' and check /var/log/rabbitmq/."
}

ensure_rabbitmq_management() {
    # `pkgq stats` reads taken (unacknowledged) counts from the management API; the plugin ships
    # with the server. Without it, stats show those counts as unknown.
    if rabbitmq-plugins -q is_enabled rabbitmq_management >/dev/null 2>&1; then return; fi
    if [ "$(id -u)" -eq 0 ]; then
        say "enabling the RabbitMQ management plugin"
        rabbitmq-plugins -q enable rabbitmq_management >/dev/null
    else
        say "note: run 'sudo rabbitmq-plugins enable rabbitmq_management' for taken counts in pkgq stats"
    fi
}

ensure_postgres
ensure_postgres_access
ensure_postgres_roles
ensure_rabbitmq
ensure_rabbitmq_management
# TLS listeners with a private CA for this machine (the TLS tests use them; README, TLS).
"$(dirname "$0")/ensure-tls.sh"
say "PostgreSQL and RabbitMQ are up"
