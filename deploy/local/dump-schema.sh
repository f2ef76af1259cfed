#!/usr/bin/env bash
# `make schema`: write infra/postgres/schema.sql, the schema the code is written against, from a
# scratch database that every migration was applied to, in order (pg_dump --schema-only, without
# owners, grants or the dump's own settings). tests/integration/test_migrations.py fails until
# it matches what the migrations yield: run this after adding one, and review the diff.
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=${BIN:-.venv/bin}
server=${PKGQ_SCHEMA_PG_SERVER:-postgresql://postgres@127.0.0.1:5432}
db="pkgq_schema_dump_$$"
trap 'psql -q "$server/postgres" -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null' EXIT
psql -q "$server/postgres" -c "CREATE DATABASE $db" >/dev/null
PKGQ_MIGRATE_DSN="$server/$db" PKGQ_POSTGRES_DSN="$server/$db" PKGQ_RUNTIME_ROLE='' \
    PKGQ_LOG_LEVEL=warning "$bin/pkgq" migrate >/dev/null
{
    echo "-- pkgq's schema, as every migration in infra/postgres/migrations yields it, applied in"
    echo "-- order. Written by \`make schema\` (deploy/local/dump-schema.sh); checked by"
    echo "-- tests/integration/test_migrations.py. Not applied by \`pkgq migrate\`: the migrations are."
    # Without pg_dump's comments, session settings and (15.14+) psql \restrict lines, whose key
    # changes on every run.
    pg_dump --schema-only --no-owner --no-privileges --schema=telecom "$server/$db" \
        | sed -e '/^--/d' -e '/^SET /d' -e '/^SELECT pg_catalog.set_config/d' \
              -e '/^\\restrict /d' -e '/^\\unrestrict /d' \
        | cat -s
} > infra/postgres/schema.sql
echo "wrote infra/postgres/schema.sql"
