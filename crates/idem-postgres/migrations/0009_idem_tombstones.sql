-- Tombstones: left by the sweep in place of records whose window ended, while
-- late retries of their keys are still refused (the store's tombstone grace
-- period). Only the key, its fingerprint, its last token and when its window
-- ended are kept; the stored answer is gone.
CREATE TABLE IF NOT EXISTS idem_tombstones (
    scope       TEXT   NOT NULL,
    key         TEXT   NOT NULL,
    fingerprint BYTEA  NOT NULL,
    token       BIGINT NOT NULL CHECK (token > 0),
    expired_at  BIGINT NOT NULL,
    PRIMARY KEY (scope, key)
);
CREATE INDEX IF NOT EXISTS idem_tombstones_expired_at ON idem_tombstones (expired_at);
