-- Least privilege. The role that runs `pkgq migrate` owns the schema; every other pkgq process
-- connects as a runtime role that may read and write rows and nothing more: no DDL, no
-- TRUNCATE, no ownership. The runtime role's name is a setting (PKGQ_RUNTIME_ROLE), so the
-- grants live in a function that migrate calls with it after every run (infra/postgres/
-- migrate.py): re-granting is idempotent, and a table a later migration adds is covered both by
-- that call and by the default privileges set here.
CREATE FUNCTION telecom.grant_runtime(runtime name) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('GRANT USAGE ON SCHEMA telecom TO %I', runtime);
    EXECUTE format(
        'GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA telecom TO %I', runtime);
    -- The migration history is the owner's: the runtime may read it, never rewrite it.
    EXECUTE format(
        'REVOKE INSERT, UPDATE, DELETE ON telecom.schema_migrations FROM %I', runtime);
    EXECUTE format('GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA telecom TO %I', runtime);
    EXECUTE format('ALTER DEFAULT PRIVILEGES IN SCHEMA telecom '
                   'GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO %I', runtime);
    EXECUTE format('ALTER DEFAULT PRIVILEGES IN SCHEMA telecom '
                   'GRANT USAGE, SELECT ON SEQUENCES TO %I', runtime);
END
$$;

-- Functions are executable by PUBLIC by default; this one is for the owner alone.
REVOKE EXECUTE ON FUNCTION telecom.grant_runtime(name) FROM PUBLIC;
