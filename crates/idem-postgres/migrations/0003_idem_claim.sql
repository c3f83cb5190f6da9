-- The first round trip of a claim-first apply (PgStore::apply_claim_first),
-- sent in the same query as BEGIN: tries the key's transaction-level advisory
-- lock and checks that the key has no record. Returns nothing when both hold,
-- so the transaction goes on holding the lock of a key known to be new.
-- Otherwise it raises, and the caller rolls back and takes the replay-first
-- path, which reads the record:
--   IDM01  the lock is held by another transaction (a concurrent duplicate);
--   IDM02  the key has a record (a duplicate, or a lease to take over).
--
-- Each statement of a VOLATILE function takes a new snapshot in READ
-- COMMITTED, so the check after the lock sees what the lock's previous holder
-- committed.
CREATE FUNCTION idem_claim_v1(p_scope TEXT, p_key TEXT, p_lock BIGINT) RETURNS VOID
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    IF NOT pg_try_advisory_xact_lock(p_lock) THEN
        RAISE EXCEPTION 'idempotency key % in scope % is held by another transaction', p_key, p_scope
            USING ERRCODE = 'IDM01';
    END IF;
    PERFORM 1 FROM idem_records WHERE scope = p_scope AND key = p_key;
    IF FOUND THEN
        RAISE EXCEPTION 'idempotency key % in scope % already has a record', p_key, p_scope
            USING ERRCODE = 'IDM02';
    END IF;
END
$$;

-- The index on created_at served only `idem keys ls` (newest first), an
-- occasional listing that can scan; every apply paid for it with one more
-- index write.
DROP INDEX idem_records_created_at;

-- The record's CHECK constraints are the invariants of the types that write
-- every row (idem_core's RecordState, Outcome, FencingToken); PostgreSQL reads
-- and compiles each CHECK expression again for every statement that inserts
-- or updates a row, which was a tenth of an apply's server time. NOT NULL
-- and the key stay.
ALTER TABLE idem_records
    DROP CONSTRAINT idem_records_fingerprint_len,
    DROP CONSTRAINT idem_records_state,
    DROP CONSTRAINT idem_records_token_positive,
    DROP CONSTRAINT idem_records_outcome_kind,
    DROP CONSTRAINT idem_records_outcome_matches_state;
