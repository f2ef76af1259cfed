-- The two Postgres roles of pkgq (README, Roles), for a dev box: run by ensure-services.sh as
-- the superuser, with psql variables owner, runtime and db. Idempotent. Production runs the
-- equivalent by hand (the README's SQL) with passwords and without CREATEDB.
SELECT format('CREATE ROLE %I LOGIN NOSUPERUSER CREATEDB NOCREATEROLE', :'owner')
WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = :'owner') \gexec
SELECT format('CREATE ROLE %I LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE', :'runtime')
WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = :'runtime') \gexec
-- A database made before roles existed belongs to postgres: hand it to the owner, so that
-- `pkgq migrate` (as the owner) can go on migrating it.
SELECT format('ALTER DATABASE %I OWNER TO %I', :'db', :'owner')
FROM pg_database WHERE datname = :'db' AND datdba <> (SELECT oid FROM pg_roles WHERE rolname = :'owner') \gexec
