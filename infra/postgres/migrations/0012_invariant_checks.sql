-- pkgq 0012: invariants checked in production (infra/postgres/invariants.py).
--
-- The relay runs every check periodically (PKGQ_INVARIANT_CHECK_INTERVAL) and `pkgq doctor` on
-- demand; both store each check's last result here, one row per check, so the console's
-- overview (refreshed every few seconds) reads them instead of running the checks itself.
-- sample: up to 20 of the violating rows, as JSON objects; violations: how many there were.
-- The runtime role is granted this table like every other one: by telecom.grant_runtime,
-- which `pkgq migrate` calls after every run, and by the default privileges 0007 set.
CREATE TABLE telecom.invariant_checks (
    check_name text        PRIMARY KEY,
    violations bigint      NOT NULL CHECK (violations >= 0),
    sample     jsonb       NOT NULL DEFAULT '[]'::jsonb,
    checked_at timestamptz NOT NULL DEFAULT now()
);

-- An operator's release of a hold that has no way out (the console's holds page, `pkgq dlq
-- release-hold`) is audited like the other operator actions.
ALTER TABLE telecom.operator_actions DROP CONSTRAINT operator_actions_action_check;
ALTER TABLE telecom.operator_actions ADD CONSTRAINT operator_actions_action_check CHECK (action IN (
    'cancel', 'adjust_quota', 'edit_replay', 'replay', 'discard', 'release_hold'));
