-- pkgq 0021: repair the activation times written before a batch's clock was read under its
-- users' locks. Until then an item's activated_at was the activating transaction's start
-- (now()), taken before it waited for the user's lock: an item could be "activated" before it
-- was created, or before the item activated ahead of it, and a time package's expire_at,
-- counted from that moment, lost the time its activation spent waiting.
--
-- What can be known is repaired: an item's activation is moved up to the latest creation or
-- activation of it and of the user's items activated before it (activation order is queue
-- order, (created_at, id)), and its expire_at moves with it (activated_at + duration, as the
-- domain writes it). For an item still active that gives back the time taken from it: its
-- granted access (telecom.access) and its time-expiry timer, if not yet published, move too.
-- The end of an item that is over was not stored, so it bounds nothing here.
--
-- Every item changed is recorded with its old and new times in telecom.transition_time_repairs,
-- and a NOTICE gives the counts (`pkgq migrate` logs it). Expand only: a new table, and
-- updates of rows under their users' locks, taken in user_id order as every batch takes them,
-- so no batch writes back an item it loaded before the repair; the previous release runs on.
CREATE TABLE telecom.transition_time_repairs (
    item_id bigint PRIMARY KEY,
    user_id uuid NOT NULL,
    status telecom.package_status NOT NULL,
    activated_at_was timestamptz NOT NULL,
    activated_at timestamptz NOT NULL,
    expire_at_was timestamptz,
    expire_at timestamptz,
    repaired_at timestamptz NOT NULL DEFAULT now()
);

COMMENT ON TABLE telecom.transition_time_repairs IS
    'Items whose activated_at (and expire_at) migration 0021 moved up, with the old times.';

DO $$
DECLARE
    -- Per item, the latest creation or activation of it and of the user's items before it in
    -- activation order: where that is after its activated_at, the activation moves up to it.
    fixed constant text := $fixed$
        SELECT id, user_id, activated_at AS was, expire_at AS expire_was, moved_to
        FROM (
            SELECT q.id, q.user_id, q.activated_at, q.expire_at,
                   max(greatest(q.activated_at, q.created_at)) OVER (
                       PARTITION BY q.user_id ORDER BY q.created_at, q.id
                       ROWS UNBOUNDED PRECEDING) AS moved_to
            FROM telecom.package_queue q
            WHERE q.activated_at IS NOT NULL
        ) AS ordered
        WHERE moved_to > activated_at
    $fixed$;
    moved integer;
    active integer;
    granted integer;
    timers integer;
BEGIN
    EXECUTE format(
        'SELECT 1 FROM telecom.queue_users u WHERE u.user_id IN (SELECT user_id FROM (%s) f) '
        'ORDER BY u.user_id FOR UPDATE', fixed);
    -- Found again under the locks (a statement of its own: a snapshot taken after them).
    EXECUTE format('CREATE TEMPORARY TABLE pkgq_0021_fixed ON COMMIT DROP AS %s', fixed);

    WITH repaired AS (
        UPDATE telecom.package_queue q
        SET activated_at = f.moved_to,
            expire_at = CASE WHEN q.duration IS NULL THEN q.expire_at
                             ELSE f.moved_to + q.duration END
        FROM pkgq_0021_fixed f
        WHERE q.id = f.id
        RETURNING q.id, q.user_id, q.status, f.was, q.activated_at, f.expire_was, q.expire_at
    )
    INSERT INTO telecom.transition_time_repairs
        (item_id, user_id, status, activated_at_was, activated_at, expire_at_was, expire_at)
    SELECT * FROM repaired;
    GET DIAGNOSTICS moved = ROW_COUNT;

    SELECT count(*) INTO active FROM telecom.transition_time_repairs
    WHERE status = 'active' AND expire_at IS DISTINCT FROM expire_at_was;

    UPDATE telecom.access a SET expire_at = r.expire_at, updated_at = now()
    FROM telecom.transition_time_repairs r
    WHERE a.user_id = r.user_id AND a.item_id = r.item_id AND a.granted
      AND r.status = 'active' AND a.expire_at IS DISTINCT FROM r.expire_at;
    GET DIAGNOSTICS granted = ROW_COUNT;

    -- The timer's body says when it is due (PackageExpiryDue.due_at, unix seconds): both move.
    UPDATE telecom.outbox o
    SET available_at = r.expire_at,
        body = convert_to(
            jsonb_set(convert_from(o.body, 'UTF8')::jsonb, '{due_at}',
                      to_jsonb(floor(extract(epoch FROM r.expire_at))::bigint))::text,
            'UTF8')
    FROM telecom.transition_time_repairs r
    WHERE o.cancel_key = 'expire:' || r.item_id  -- events.outgoing.expiry_key
      AND o.published_at IS NULL
      AND r.status = 'active' AND r.expire_at IS DISTINCT FROM r.expire_at_was;
    GET DIAGNOSTICS timers = ROW_COUNT;

    RAISE NOTICE 'pkgq 0021: moved up the activation time of % item(s) (telecom.transition_time_repairs); % still active got back time on expire_at, % granted access row(s) and % pending expiry timer(s) moved with them',
        moved, active, granted, timers;
END
$$;
