-- Dead letters: messages given up on by the outbox relay or a consumer, kept
-- with their original key for a redrive.
--
-- Adopted as it is when an earlier idem-broker created it with these
-- columns. `idem_broker_schema` was that broker's record of its own
-- migrations (the outbox and the dead letters, both adopted by now); nothing
-- reads it any more.
CREATE TABLE IF NOT EXISTS idem_dead_letters (
    id            BIGINT  GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    origin        TEXT    NOT NULL,
    destination   TEXT    NOT NULL,
    key           TEXT    NOT NULL,
    payload       BYTEA   NOT NULL,
    headers       TEXT    NOT NULL,
    attempts      INTEGER NOT NULL CHECK (attempts >= 0),
    last_error    TEXT    NOT NULL,
    first_seen_at BIGINT  NOT NULL,
    dead_at       BIGINT  NOT NULL,
    redriven_at   BIGINT  NULL
);

-- Listing goes by id; retention deletes by age.
CREATE INDEX IF NOT EXISTS idem_dead_letters_dead_at ON idem_dead_letters (dead_at);

DROP TABLE IF EXISTS idem_broker_schema;
