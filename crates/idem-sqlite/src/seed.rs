//! Test and benchmark hooks on the `idem_records` table: settled records
//! generated in bulk ([`RecordSeed`]), and the table's statistics and size.
//! Not part of the protocol: they write and read the table directly, on the
//! caller's connection (in an effect or a [`transaction`](idem_core::AtomicStore::transaction)).

use idem_core::RecordSeed;
use rusqlite::{Connection, params};

use crate::store::SqliteStore;

/// Random 32-hex-digit keys, a random fingerprint, an empty JSON outcome.
const SEED: &str = "
    WITH RECURSIVE n(i) AS (SELECT ?2 UNION ALL SELECT i + 1 FROM n WHERE i < ?2 + ?3 - 1)
    INSERT INTO idem_records (scope, key, fingerprint, state, token, lease_until, outcome_kind,
                              outcome_body, outcome_meta, created_at, updated_at, expires_at)
    SELECT ?6, ?1 || '-' || i || '-' || lower(hex(randomblob(12))), randomblob(32), 'completed',
           c * 1024 + 1, NULL, 'success', CAST('{}' AS BLOB), '{}', c, c, c + ?5
    FROM (SELECT i, ?4 - ?5 + abs(random() % ?5) AS c FROM n)";

impl SqliteStore {
    /// Test hook: adds the settled records `seed` describes to the dedupe
    /// table, in one statement on `conn`.
    pub fn seed_records(conn: &Connection, seed: &RecordSeed) -> rusqlite::Result<()> {
        conn.execute(
            SEED,
            params![
                seed.tag,
                seed.from,
                seed.count,
                seed.now.0,
                seed.window_ms(),
                seed.scope.as_str()
            ],
        )?;
        Ok(())
    }

    /// Test hook: refreshes the planner's statistics of the dedupe table (as
    /// after a bulk load) and returns the database file's size in bytes (the
    /// records are nearly all of it once seeded).
    pub fn analyze_records(conn: &Connection) -> rusqlite::Result<u64> {
        conn.execute_batch("ANALYZE idem_records")?;
        let bytes: i64 = conn.query_row(
            "SELECT page_count * page_size FROM pragma_page_count(), pragma_page_size()",
            [],
            |r| r.get(0),
        )?;
        Ok(bytes.unsigned_abs())
    }
}
