"""PostgreSQL adapters: pool, migrations and the repositories behind each table."""
