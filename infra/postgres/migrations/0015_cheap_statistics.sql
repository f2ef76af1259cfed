-- pkgq 0015: cheap statistics. The status port of every process refreshes its figures every
-- 10 s and every open console overview every 3 s: none of them may count the inbox, the
-- outbox's published rows or the dead-letter store row by row (infra/postgres/stats.py says
-- how each figure is read now).

-- The outbox's unpublished rows by route and due time: per route, the oldest due row is the
-- first entry, and the due (pending) and scheduled rows are ranges of it, counted up to a cap
-- without reading a published row. The relay's claim keeps its own index (outbox_pending).
CREATE INDEX outbox_unpublished_route ON telecom.outbox (route, available_at)
    WHERE published_at IS NULL;

-- Users held behind a blocker, by consumer and hold state: ranges of this (small) index, read
-- in `since` order (which no other index of holds has), so a count that stops at the cap reads
-- this index and never the table.
CREATE INDEX holds_held ON telecom.holds (consumer, state, since) WHERE blocker IS NOT NULL;

-- Buried dead letters per route (expired ones apart), kept in the transaction that buries,
-- replays, discards, supersedes or purges them, by the triggers below: one small upsert per
-- statement on the dead-letter store that moves a row into or out of `buried`, spread over 8
-- slots like transition_counts (read with sum(buried)). A transaction keeps to one slot (its
-- transaction id's), so two of its statements never lock two slots of one route in an order
-- another transaction could cross. The dead-letter store itself is never counted for figures.
CREATE TABLE telecom.dead_letter_counts (
    route  text     NOT NULL,
    kind   text     NOT NULL CHECK (kind IN ('dead_letters', 'expired')),
    slot   smallint NOT NULL,
    buried bigint   NOT NULL DEFAULT 0,
    PRIMARY KEY (route, kind, slot)
);

CREATE FUNCTION telecom.count_buried_dead_letters() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- The rows that entered `buried` (+1) and left it (-1), by route and kind; a row that
    -- stayed buried under the same route and kind nets to nothing and writes nothing.
    IF TG_OP = 'INSERT' THEN
        INSERT INTO telecom.dead_letter_counts AS c (route, kind, slot, buried)
        SELECT route, CASE WHEN reason = 'expired' THEN 'expired' ELSE 'dead_letters' END,
               (txid_current() % 8)::smallint, count(*)
        FROM new_rows WHERE status = 'buried' GROUP BY 1, 2 ORDER BY 1, 2
        ON CONFLICT (route, kind, slot) DO UPDATE SET buried = c.buried + excluded.buried;
    ELSIF TG_OP = 'UPDATE' THEN
        INSERT INTO telecom.dead_letter_counts AS c (route, kind, slot, buried)
        SELECT route, kind, (txid_current() % 8)::smallint, sum(n)
        FROM (
            SELECT route, CASE WHEN reason = 'expired' THEN 'expired' ELSE 'dead_letters' END
                       AS kind, 1 AS n
            FROM new_rows WHERE status = 'buried'
            UNION ALL
            SELECT route, CASE WHEN reason = 'expired' THEN 'expired' ELSE 'dead_letters' END,
                   -1
            FROM old_rows WHERE status = 'buried'
        ) moved
        GROUP BY 1, 2 HAVING sum(n) <> 0 ORDER BY 1, 2
        ON CONFLICT (route, kind, slot) DO UPDATE SET buried = c.buried + excluded.buried;
    ELSE
        INSERT INTO telecom.dead_letter_counts AS c (route, kind, slot, buried)
        SELECT route, CASE WHEN reason = 'expired' THEN 'expired' ELSE 'dead_letters' END,
               (txid_current() % 8)::smallint, -count(*)
        FROM old_rows WHERE status = 'buried' GROUP BY 1, 2 ORDER BY 1, 2
        ON CONFLICT (route, kind, slot) DO UPDATE SET buried = c.buried + excluded.buried;
    END IF;
    RETURN NULL;
END;
$$;
-- (A trigger with transition tables serves one event: three triggers, one function.)
CREATE TRIGGER dead_letters_count_buried_insert AFTER INSERT ON telecom.dead_letters
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION telecom.count_buried_dead_letters();
CREATE TRIGGER dead_letters_count_buried_update AFTER UPDATE ON telecom.dead_letters
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION telecom.count_buried_dead_letters();
CREATE TRIGGER dead_letters_count_buried_delete AFTER DELETE ON telecom.dead_letters
    REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION telecom.count_buried_dead_letters();

CREATE FUNCTION telecom.forget_buried_dead_letters() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM telecom.dead_letter_counts;
    RETURN NULL;
END;
$$;
CREATE TRIGGER dead_letters_count_buried_truncate AFTER TRUNCATE ON telecom.dead_letters
    FOR EACH STATEMENT EXECUTE FUNCTION telecom.forget_buried_dead_letters();

-- What is buried already (creating the triggers locked the store against writes until this
-- migration commits, so nothing is counted twice or missed).
INSERT INTO telecom.dead_letter_counts (route, kind, slot, buried)
SELECT route, CASE WHEN reason = 'expired' THEN 'expired' ELSE 'dead_letters' END, 0, count(*)
FROM telecom.dead_letters WHERE status = 'buried' GROUP BY 1, 2;

-- Moves in the last minute: a ring of 60 one-second buckets per route and transition (and
-- slot), written by the statement that adds to transition_counts (infra/postgres/
-- transitions.py `count`: still one statement). A bucket holds the unix second `at` it counts;
-- it is taken over by the next minute's same second. Its size is fixed (routes x transitions x
-- 60 x 8 slots at most): it never needs pruning.
CREATE TABLE telecom.transition_seconds (
    transition text     NOT NULL,
    route      text     NOT NULL,
    second     smallint NOT NULL CHECK (second BETWEEN 0 AND 59),
    slot       smallint NOT NULL,
    at         bigint   NOT NULL,
    count      bigint   NOT NULL,
    PRIMARY KEY (transition, route, second, slot)
);
