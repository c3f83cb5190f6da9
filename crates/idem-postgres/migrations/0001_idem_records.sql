-- One row per (scope, key): the dedupe record of the Idem apply protocol.
--
-- Every time is milliseconds since the Unix epoch, computed by the
-- application's clock and passed in as a parameter; the database's own clock
-- is never used, so tests can move time exactly.
CREATE TABLE idem_records (
    scope        TEXT   NOT NULL,
    key          TEXT   NOT NULL,
    fingerprint  BYTEA  NOT NULL,
    state        TEXT   NOT NULL,
    token        BIGINT NOT NULL,
    lease_until  BIGINT NULL,
    outcome_kind TEXT   NULL,
    outcome_body BYTEA  NULL,
    outcome_meta TEXT   NULL,
    created_at   BIGINT NOT NULL,
    updated_at   BIGINT NOT NULL,
    expires_at   BIGINT NOT NULL,
    CONSTRAINT idem_records_pkey PRIMARY KEY (scope, key),
    CONSTRAINT idem_records_fingerprint_len CHECK (octet_length(fingerprint) = 32),
    CONSTRAINT idem_records_state CHECK (state IN ('in_flight', 'completed', 'failed')),
    CONSTRAINT idem_records_token_positive CHECK (token > 0),
    CONSTRAINT idem_records_outcome_kind CHECK (outcome_kind IN ('success', 'terminal_failure')),
    -- A settled record always carries its outcome, and the kind matches the state;
    -- an in-flight record has none.
    CONSTRAINT idem_records_outcome_matches_state CHECK (
        (state = 'in_flight' AND outcome_kind IS NULL)
        OR (state = 'completed' AND outcome_kind = 'success' AND outcome_body IS NOT NULL AND outcome_meta IS NOT NULL)
        OR (state = 'failed' AND outcome_kind = 'terminal_failure' AND outcome_body IS NOT NULL AND outcome_meta IS NOT NULL)
    )
);

-- Retention: the sweeper deletes the records whose window ended, oldest first.
CREATE INDEX idem_records_expires_at ON idem_records (expires_at);

-- Inspection: `idem records list` shows the newest records first.
CREATE INDEX idem_records_created_at ON idem_records (created_at DESC);
