-- pkgq: no-transaction
-- pkgq 0024: the indexes a message's identity is looked up by (migration 0022), built
-- CONCURRENTLY: the inbox, attempts and parked messages by the message_id a message was sent
-- under (`pkgq find`, the invariant checks), dead letters by their message's key (the inbox's
-- claim marks them superseded by it; a hold is released by it; a repeat is found by it).
CREATE INDEX CONCURRENTLY IF NOT EXISTS inbox_sent_as ON telecom.inbox (consumer, sent_as)
    WHERE sent_as IS NOT NULL;
CREATE INDEX CONCURRENTLY IF NOT EXISTS attempts_sent_as ON telecom.attempts (consumer, sent_as)
    WHERE sent_as IS NOT NULL;
CREATE INDEX CONCURRENTLY IF NOT EXISTS parked_sent_as ON telecom.parked (consumer, sent_as)
    WHERE sent_as IS NOT NULL;
CREATE INDEX CONCURRENTLY IF NOT EXISTS dead_letters_message_key ON telecom.dead_letters
    (consumer, message_key) WHERE message_key IS NOT NULL;
