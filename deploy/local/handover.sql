-- Run in the pkgq database by ensure-services.sh: a schema migrated before roles existed
-- belongs to postgres; give it and everything in it to the owner role (psql variable owner).
-- Idempotent: nothing to do once the owner owns them.
SELECT format('ALTER SCHEMA telecom OWNER TO %I', :'owner')
FROM pg_namespace WHERE nspname = 'telecom' AND nspowner <> (SELECT oid FROM pg_roles WHERE rolname = :'owner') \gexec
SELECT format('ALTER TABLE telecom.%I OWNER TO %I', c.relname, :'owner')
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = 'telecom' AND c.relkind IN ('r', 'p')
  AND c.relowner <> (SELECT oid FROM pg_roles WHERE rolname = :'owner') \gexec
SELECT format('ALTER FUNCTION %s OWNER TO %I', p.oid::regprocedure, :'owner')
FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
WHERE n.nspname = 'telecom' AND p.proowner <> (SELECT oid FROM pg_roles WHERE rolname = :'owner') \gexec
SELECT format('ALTER TYPE telecom.%I OWNER TO %I', t.typname, :'owner')
FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace
WHERE n.nspname = 'telecom' AND t.typtype = 'e'
  AND t.typowner <> (SELECT oid FROM pg_roles WHERE rolname = :'owner') \gexec
