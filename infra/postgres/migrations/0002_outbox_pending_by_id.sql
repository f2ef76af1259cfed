-- pkgq 0002: the relay reads pending rows in id order; without this index the planner walks the
-- primary key through every published row (the whole history) on each round.
CREATE INDEX outbox_pending_by_id ON telecom.outbox (id) WHERE published_at IS NULL;
