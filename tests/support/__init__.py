"""Helpers for the integration, conformance and end-to-end tests, a module per concern:
observing (wait for a condition, read a table), deliveries (build or publish messages, as pkgq
or as an outsider), dead_letters (one filed as a consumer files it), hostile (the hostile
header corpus), in_process (consumers and relay in the test's loop), processes (spawned
`pkgq`), workers (a stale worker), pg_roles and broker_users (the session's Postgres roles and
RabbitMQ users), tls (the dev CA's certificates), big_tables (a busy deployment's growing
tables, filled fast) and schema_catalog (a database's schema read from its catalog, to
compare the migrations with schema.sql). The fixtures that build and tear down what
they need are in tests/conftest.py."""
