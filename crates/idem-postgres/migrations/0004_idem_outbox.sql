-- The transactional outbox: one row per message enqueued in a business
-- transaction, claimed by relays under a lease and marked sent once the
-- destination confirmed it.
--
-- Databases written by earlier versions of idem-broker may already hold this
-- table, its indexes, function and trigger, created by the broker's own
-- migrations with exactly these definitions: every statement here creates
-- only what is missing (or replaces it with the same definition), so such a
-- table is adopted as it is, rows included.
CREATE TABLE IF NOT EXISTS idem_outbox (
    id           BIGINT  GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    destination  TEXT    NULL,
    key          TEXT    NOT NULL,
    payload      BYTEA   NOT NULL,
    headers      TEXT    NOT NULL,
    state        TEXT    NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'sent')),
    attempts     INTEGER NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    last_error   TEXT    NULL,
    created_at   BIGINT  NOT NULL,
    available_at BIGINT  NULL,
    lease_owner  TEXT    NULL,
    lease_until  BIGINT  NULL,
    sent_at      BIGINT  NULL
);

-- Claims look for pending rows in id order; the sweep for old sent ones.
CREATE INDEX IF NOT EXISTS idem_outbox_pending ON idem_outbox (id) WHERE state = 'pending';
CREATE INDEX IF NOT EXISTS idem_outbox_sent_at ON idem_outbox (sent_at) WHERE state = 'sent';

-- Wakes listening relays when the inserting transaction commits. A hint, not
-- a queue: relays poll as well.
CREATE OR REPLACE FUNCTION idem_outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('idem_outbox', '');
    RETURN NULL;
END
$$;
DROP TRIGGER IF EXISTS idem_outbox_notify ON idem_outbox;
CREATE TRIGGER idem_outbox_notify AFTER INSERT ON idem_outbox
    FOR EACH STATEMENT EXECUTE FUNCTION idem_outbox_notify();
