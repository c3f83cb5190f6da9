-- The audit log of what operators change by hand (idem keys rm, idem keys
-- release, idem dlq discard, idem dlq archive): who, when, what, and the
-- record or dead letter as it was, as JSON text. A row names a record by its
-- scope and key, or a dead letter by its id (and the letter's key).
CREATE TABLE IF NOT EXISTS idem_audit (
    id             BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at             BIGINT NOT NULL,
    actor          TEXT   NOT NULL,
    action         TEXT   NOT NULL,
    scope          TEXT   NULL,
    key            TEXT   NOT NULL,
    dead_letter_id BIGINT NULL,
    before         TEXT   NOT NULL,
    CHECK ((scope IS NULL) <> (dead_letter_id IS NULL))
);

-- Dead letters an operator set aside: kept until the retention ends, no
-- longer waiting for a redrive.
ALTER TABLE idem_dead_letters ADD COLUMN IF NOT EXISTS archived_at BIGINT NULL;
