-- pkgq: no-transaction
-- pkgq 0025: the activations of the last day, which the relay's periodic check of activation
-- times looks at (infra/postgres/invariants.py, `activation_times`): without it that check read
-- the whole of package_queue every minute (2.5 s on a million rows). Built CONCURRENTLY.
CREATE INDEX CONCURRENTLY IF NOT EXISTS package_queue_activated ON telecom.package_queue
    (activated_at) WHERE activated_at IS NOT NULL;
