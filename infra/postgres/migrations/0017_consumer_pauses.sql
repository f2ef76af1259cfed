-- pkgq 0017: routes whose consumption is paused (`pkgq route pause`, the console's overview).
-- Every replica's consumers of a paused route cancel their subscriptions within
-- PKGQ_PAUSE_POLL seconds and give back what they hold, so the route's messages wait on the
-- broker, in order, until it is resumed. A row here outlives restarts: a replica that starts
-- while its route is paused declares its queues but does not subscribe.
-- `automatic`: paused by the circuit breaker (PKGQ_BREAKER_*), not by a person.
-- (route_pauses, 0003, is another thing: it holds the relay's publishing of a route back.)
CREATE TABLE telecom.consumer_pauses (
    route     text        PRIMARY KEY,
    paused_at timestamptz NOT NULL DEFAULT now(),
    paused_by text        NOT NULL,
    reason    text,
    automatic boolean     NOT NULL DEFAULT false
);

-- Pauses and resumes are audited like the other operator actions. The CHECK only widens (its
-- values are a superset of 0012's, tests/integration/test_migrations.py checks that): the
-- previous release never writes the new values, and reads them as text.
ALTER TABLE telecom.operator_actions
    DROP CONSTRAINT operator_actions_action_check,
    ADD CONSTRAINT operator_actions_action_check CHECK (action IN (
        'cancel', 'adjust_quota', 'edit_replay', 'replay', 'discard', 'release_hold',
        'pause_route', 'resume_route')) NOT VALID;
ALTER TABLE telecom.operator_actions VALIDATE CONSTRAINT operator_actions_action_check;
