-- Consumers' failed attempts per message: how a poison message is recognised
-- where the broker keeps no delivery count. Written only on failures, in a
-- transaction of its own (the effect's was rolled back).
--
-- Earlier idem-broker consumers created this table themselves when they
-- started, with these columns: adopted as it is.
CREATE TABLE IF NOT EXISTS idem_consumer_attempts (
    scope      TEXT    NOT NULL,
    key        TEXT    NOT NULL,
    attempts   INTEGER NOT NULL,
    first_at   BIGINT  NOT NULL,
    updated_at BIGINT  NOT NULL,
    last_error TEXT    NOT NULL,
    PRIMARY KEY (scope, key)
);
