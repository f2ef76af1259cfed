#!/usr/bin/env bash
# TLS for this machine's PostgreSQL and RabbitMQ, for `make test` (the TLS tests) and for trying
# pkgq over TLS by hand. Called by ensure-services.sh once both servers run. Idempotent:
#   - a private CA, a server certificate (localhost, 127.0.0.1) and client certificates (CN pkgq,
#     and CN pkgq-external-test for the test of a login by certificate alone),
#     made with openssl in $PKGQ_DEV_TLS_DIR (default /etc/pkgq-dev-tls), and made again when
#     missing, not signed by the CA there, or within 30 days of expiry;
#   - PostgreSQL: ssl = on with those files (ALTER SYSTEM + pg_reload_conf, no restart); plain
#     TCP keeps working;
#   - RabbitMQ: amqps on 127.0.0.1:5671 and the management API over https on 127.0.0.1:15671,
#     next to 5672 and 15672, and a login by client certificate (SASL EXTERNAL, its common name
#     as the user). Written as a marked block into rabbitmq.conf; the node restarts
#     only when that block changed (and goes back to the old file if it does not come up).
# This is a development CA for this machine only: production brings its own certificates
# (README, TLS).
set -euo pipefail

SCRIPT=ensure-tls
# shellcheck source=deploy/local/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

DIR=${PKGQ_DEV_TLS_DIR:-/etc/pkgq-dev-tls}
RABBITMQ_CONF=${RABBITMQ_CONFIG_FILE:-/etc/rabbitmq/rabbitmq.conf}
RABBITMQ_CONF=${RABBITMQ_CONF%.conf}.conf
DAYS_LEFT=$((30 * 24 * 3600))
BEGIN='# BEGIN pkgq dev TLS (deploy/local/ensure-tls.sh; edits inside this block are replaced)'
END='# END pkgq dev TLS'

if ! command -v openssl >/dev/null 2>&1; then
    if command -v apt-get >/dev/null 2>&1 && as_root true; then
        say "installing openssl from Debian's packages"
        as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openssl >/dev/null \
            || die "could not install openssl: run 'sudo apt-get install -y openssl' and try again."
    else
        die "openssl is missing: run 'sudo apt-get install -y openssl' and try again."
    fi
fi

# --- certificates ----------------------------------------------------------------------------

cert_fresh() {
    # $1 is a certificate that exists, is signed by our CA and has 30 days left.
    [ -s "$1" ] && openssl x509 -checkend "$DAYS_LEFT" -noout -in "$1" >/dev/null 2>&1 \
        && openssl verify -CAfile "$DIR/ca.pem" "$1" >/dev/null 2>&1
}

# Whether a file is there needs no right to read it (stat only): no root for a check.
ca_fresh() {
    [ -s "$DIR/ca.pem" ] && [ -s "$DIR/ca.key" ] \
        && openssl x509 -checkend "$DAYS_LEFT" -noout -in "$DIR/ca.pem" >/dev/null 2>&1
}

certs_fresh() {
    ca_fresh && cert_fresh "$DIR/server.pem" && cert_fresh "$DIR/client.pem" \
        && cert_fresh "$DIR/external-test.pem" \
        && [ -s "$DIR/postgres/server.key" ] && [ -s "$DIR/rabbitmq/server.key" ] \
        && [ -s "$DIR/client.key" ] && [ -s "$DIR/external-test.key" ]
}

make_certs() {
    # Runs as root: writes $DIR and hands each server its own copy of the server key, with the
    # modes they demand (PostgreSQL refuses a key that others can read).
    local work
    work=$(mktemp -d)
    trap 'rm -rf "$work"' RETURN
    mkdir -p "$DIR/postgres" "$DIR/rabbitmq"
    chmod 0755 "$DIR"
    if ! ca_fresh; then
        say "making a private CA in $DIR"
        openssl req -x509 -newkey rsa:2048 -nodes -sha256 -days 3650 -subj '/CN=pkgq dev CA' \
            -addext 'basicConstraints=critical,CA:TRUE' -addext 'keyUsage=critical,keyCertSign,cRLSign' \
            -keyout "$work/ca.key" -out "$work/ca.pem" 2>/dev/null
        install -m 0600 "$work/ca.key" "$DIR/ca.key"
        install -m 0644 "$work/ca.pem" "$DIR/ca.pem"
    fi
    say "making the server (localhost, 127.0.0.1) and client (CN pkgq) certificates"
    cat >"$work/server.ext" <<'EOF'
basicConstraints = CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = serverAuth
subjectAltName = DNS:localhost, IP:127.0.0.1
EOF
    cat >"$work/client.ext" <<'EOF'
basicConstraints = CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = clientAuth
EOF
    local name
    for name in server client external-test; do
        local subject=/CN=localhost ext=$name
        [ "$name" = client ] && subject=/CN=pkgq
        [ "$name" = external-test ] && subject=/CN=pkgq-external-test ext=client
        openssl req -new -newkey rsa:2048 -nodes -subj "$subject" \
            -keyout "$work/$name.key" -out "$work/$name.csr" 2>/dev/null
        openssl x509 -req -sha256 -days 825 -in "$work/$name.csr" -CA "$DIR/ca.pem" \
            -CAkey "$DIR/ca.key" -CAcreateserial -CAserial "$work/ca.srl" \
            -extfile "$work/$ext.ext" -out "$work/$name.pem" 2>/dev/null
        install -m 0644 "$work/$name.pem" "$DIR/$name.pem"
    done
    install -m 0600 -o postgres -g postgres "$work/server.key" "$DIR/postgres/server.key"
    install -m 0600 -o rabbitmq -g rabbitmq "$work/server.key" "$DIR/rabbitmq/server.key"
    # The client key belongs to whoever runs the tests (sudo's caller, or root).
    install -m 0600 -o "${SUDO_USER:-root}" "$work/client.key" "$DIR/client.key"
    # The test of a login by client certificate alone logs in as its own user, CN
    # pkgq-external-test (tests/e2e/test_tls_external_auth.py), never as pkgq's.
    install -m 0600 -o "${SUDO_USER:-root}" "$work/external-test.key" "$DIR/external-test.key"
    RENEWED=1
}

RENEWED=0
if ! certs_fresh; then
    as_root true || die "the dev TLS files in $DIR are missing or old, and making them needs root: run 'sudo $0'."
    if [ "$(id -u)" -ne 0 ]; then exec sudo -E "$0" "$@"; fi
    make_certs
fi

# --- PostgreSQL ------------------------------------------------------------------------------

psql_admin=(psql -h 127.0.0.1 -U postgres -d postgres -v ON_ERROR_STOP=1 -qAt)

ensure_postgres_tls() {
    local want current changed=$RENEWED setting value
    if ! "${psql_admin[@]}" -c 'select 1' >/dev/null 2>&1; then
        say "skipping PostgreSQL: cannot connect as postgres@127.0.0.1 to turn TLS on (the TLS tests will fail)"
        return
    fi
    for setting in "ssl_cert_file=$DIR/server.pem" "ssl_key_file=$DIR/postgres/server.key" \
        "ssl_ca_file=$DIR/ca.pem" "ssl=on"; do
        value=${setting#*=}
        setting=${setting%%=*}
        current=$("${psql_admin[@]}" -c "show $setting")
        if [ "$current" != "$value" ]; then
            "${psql_admin[@]}" -c "alter system set $setting = '$value'" >/dev/null
            changed=1
        fi
    done
    if [ "$changed" -eq 1 ]; then
        "${psql_admin[@]}" -c 'select pg_reload_conf()' >/dev/null
        sleep 1
    fi
    want=$(psql "host=localhost port=5432 user=postgres dbname=postgres sslmode=verify-full sslrootcert=$DIR/ca.pem" \
        -qAtc 'select ssl from pg_stat_ssl where pid = pg_backend_pid()' 2>&1) || want=$want
    [ "$want" = t ] || die "PostgreSQL does not take verify-full TLS with $DIR/ca.pem ($want); see /var/log/postgresql/."
}

# --- RabbitMQ --------------------------------------------------------------------------------

rabbit_block() {
    printf '%s\n' "$BEGIN"
    cat <<EOF
listeners.ssl.local = 127.0.0.1:5671
ssl_options.cacertfile = $DIR/ca.pem
ssl_options.certfile = $DIR/server.pem
ssl_options.keyfile = $DIR/rabbitmq/server.key
ssl_options.verify = verify_peer
ssl_options.fail_if_no_peer_cert = false
auth_mechanisms.1 = PLAIN
auth_mechanisms.2 = AMQPLAIN
auth_mechanisms.3 = EXTERNAL
ssl_cert_login_from = common_name
EOF
    if rabbitmq-plugins -q is_enabled rabbitmq_management >/dev/null 2>&1; then
        cat <<EOF
management.tcp.ip = 127.0.0.1
management.tcp.port = 15672
management.ssl.ip = 127.0.0.1
management.ssl.port = 15671
management.ssl.cacertfile = $DIR/ca.pem
management.ssl.certfile = $DIR/server.pem
management.ssl.keyfile = $DIR/rabbitmq/server.key
EOF
    fi
    printf '%s\n' "$END"
}

rabbit_ready() { rabbitmqctl -q await_startup --timeout 5 >/dev/null 2>&1; }

rabbit_restart() {
    say "restarting RabbitMQ for its TLS listeners"
    rabbitmqctl -q stop >/dev/null 2>&1 || true
    rabbitmq-server -detached >/dev/null 2>&1 || true
    local _
    for _ in $(seq 1 90); do rabbit_ready && return 0; sleep 1; done
    return 1
}

ensure_rabbitmq_tls() {
    local old new
    old=$(mktemp)
    new=$(mktemp)
    trap 'rm -f "$old" "$new"' RETURN
    [ -f "$RABBITMQ_CONF" ] && cp "$RABBITMQ_CONF" "$old"
    # The file without our block, then the block as it should be.
    awk -v b="$BEGIN" -v e="$END" '$0 == b {skip = 1; next} $0 == e {skip = 0; next} !skip' "$old" >"$new"
    rabbit_block >>"$new"
    if cmp -s "$old" "$new"; then
        if [ "$RENEWED" -eq 1 ]; then
            rabbitmqctl -q eval 'ssl:clear_pem_cache().' >/dev/null 2>&1 || true
        fi
        return
    fi
    [ "$(id -u)" -eq 0 ] || die "RabbitMQ's $RABBITMQ_CONF needs pkgq's TLS block: run 'sudo $0'."
    install -m 0644 "$new" "$RABBITMQ_CONF"
    if ! rabbit_restart; then
        say "RabbitMQ did not start with TLS: putting $RABBITMQ_CONF back as it was"
        install -m 0644 "$old" "$RABBITMQ_CONF"
        rabbit_restart || die "RabbitMQ does not start: check /var/log/rabbitmq/."
        die "RabbitMQ refused the TLS settings; see /var/log/rabbitmq/."
    fi
}

# A login by client certificate alone (SASL EXTERNAL, the certificate's common name as the
# user): the plugin that offers it ships with RabbitMQ; enabled before the block names it.
ensure_external_auth_plugin() {
    rabbitmq-plugins -q is_enabled rabbitmq_auth_mechanism_ssl >/dev/null 2>&1 && return
    [ "$(id -u)" -eq 0 ] || die "RabbitMQ needs its rabbitmq_auth_mechanism_ssl plugin: run 'sudo $0'."
    say "enabling RabbitMQ's rabbitmq_auth_mechanism_ssl plugin (login by client certificate)"
    rabbitmq-plugins -q enable rabbitmq_auth_mechanism_ssl >/dev/null 2>&1 \
        || rabbitmq-plugins -q enable --offline rabbitmq_auth_mechanism_ssl >/dev/null \
        || die "could not enable rabbitmq_auth_mechanism_ssl; see rabbitmq-plugins list."
}

ensure_postgres_tls
ensure_external_auth_plugin
ensure_rabbitmq_tls
say "TLS: PostgreSQL on 5432 (ssl), RabbitMQ amqps on 5671, CA $DIR/ca.pem"
