-- Atomic apply no longer claims a key with idem_claim_v1, which answered a
-- held or recorded key by raising (SQLSTATE IDM01 / IDM02): every duplicate
-- then wrote an ERROR line into the server's log, as if it were a fault. The
-- claim now tries the key's lock and reads its record in one query, and a
-- duplicate is read from the rows like any answer.
DROP FUNCTION IF EXISTS idem_claim_v1(TEXT, TEXT, BIGINT);
