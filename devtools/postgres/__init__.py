"""The developer tools' PostgreSQL work, kept out of infra/postgres (production's): the data
the benchmarks seed and measure by, each in a database of its own (bench_data for `pkgq bench`,
web_bench_data for `pkgq web bench`, with its baseline's SELECT 1), and statements (a query
logger that counts what a pool runs, for the bench and the tests). tools/check_sql_location.py
lets SQL live here and in tests, never in production code outside infra/postgres."""
