-- pkgq 0008: the operator console and the read API (`pkgq web`).

-- Who did what from the console (and the CLI commands that share its code path): cancels, quota
-- adjustments, edited replays, replays and discards. One row per action, written in the
-- transaction that carries the action out. `detail` holds what the action needs for audit (an
-- edit's original and new body, a cancel's reason, a bulk replay's ids and counts).
CREATE TABLE telecom.operator_actions (
    id         bigserial PRIMARY KEY,
    at         timestamptz NOT NULL DEFAULT now(),
    actor      text        NOT NULL,
    action     text        NOT NULL CHECK (action IN (
                   'cancel', 'adjust_quota', 'edit_replay', 'replay', 'discard')),
    user_id    uuid,
    item_id    bigint,
    dead_letter_id bigint,
    message_id uuid,
    detail     jsonb       NOT NULL DEFAULT '{}'::jsonb
);
CREATE INDEX operator_actions_at ON telecom.operator_actions (at);
CREATE INDEX operator_actions_user ON telecom.operator_actions (user_id, at) WHERE user_id IS NOT NULL;
CREATE INDEX operator_actions_dead_letter ON telecom.operator_actions (dead_letter_id)
    WHERE dead_letter_id IS NOT NULL;

-- GetAllMyPackages reads one user's items in queue order: an index in that order, so the read
-- is one index range scan (GetCurrentPackage uses package_queue_one_active).
CREATE INDEX package_queue_user_order ON telecom.package_queue (user_id, created_at, id);

-- The console filters dead letters by user.
CREATE INDEX dead_letters_user ON telecom.dead_letters (user_id, first_failed_at)
    WHERE user_id IS NOT NULL;
