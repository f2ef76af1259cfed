"""PostgreSQL adapters: pool, migrations and the repositories behind each table.

All of pkgq's SQL lives in this folder (tools/check_sql_location.py fails `make check`
otherwise), and each table is written by one module only, its owner; other modules read it, or
call the owner to change it:

    table               owner (writes it)        table               owner (writes it)
    queue_users         queue_repo               dead_letters        dead_letters
    package_queue       queue_repo               holds, parked       holds
    orders              queue_repo               attempts            attempts
    item_audit          audit                    ttr_strikes         strikes
    packages            catalog                  addresses           addresses
    access              access                   unique_keys         unique_keys
    inbox               inbox                    job_groups          groups
    outbox              outbox                   group_members       groups
    route_pauses        outbox                   workers             workers
    transition_counts   transitions              leases              leases
    transition_seconds  transitions              operator_actions    operator_actions
    schema_migrations   migrate                  dead_letter_counts  (triggers on dead_letters)
    route_minutes       trends                   consumer_pauses     consumer_pauses
    usage_billed        usage_billed             critical_minutes    batch_write

Retention deletes by the rule each owner declares (its `RETENTION`, a pruning.Rule): the owner
says which of its rows are past retention, retention.py runs the batched deletes. Modules that
own no table call the owners, or only read: job_state (finishing a message: its address, its
group member, an expired outbox row), replay (dead letters sent again), retention and pruning,
overdue (the sweep's reads), stats (the figures the status ports and the console's overview
show, read through indexes and counters: its docstring says how, figure by figure), pool,
read_api and console (the web's reads). The benchmarks' data is devtools/postgres' and the
tests' fixtures are tests/support's: nothing here serves only a bench or a test.
"""
