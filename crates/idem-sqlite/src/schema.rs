//! The SQLite schema and its migrations, versioned with `PRAGMA user_version`.
//!
//! Each migration runs in its own immediate transaction together with the
//! version bump, so a crash mid-migration leaves the previous version intact and
//! two processes opening the same file at once apply each step exactly once.

use rusqlite::{Connection, TransactionBehavior};

use crate::errors::map_err;
use idem_core::Error;

/// Migrations in order; migration `i` brings the schema to version `i + 1`.
const MIGRATIONS: &[&str] = &[
    r#"
CREATE TABLE idem_records (
    scope        TEXT    NOT NULL,
    key          TEXT    NOT NULL,
    fingerprint  BLOB    NOT NULL,
    state        TEXT    NOT NULL CHECK (state IN ('in_flight', 'completed', 'failed')),
    token        INTEGER NOT NULL CHECK (token > 0),
    lease_until  INTEGER,
    outcome_kind TEXT    CHECK (outcome_kind IN ('success', 'terminal_failure')),
    outcome_body BLOB,
    outcome_meta TEXT,
    created_at   INTEGER NOT NULL,
    updated_at   INTEGER NOT NULL,
    expires_at   INTEGER NOT NULL,
    PRIMARY KEY (scope, key)
) WITHOUT ROWID;
CREATE INDEX idem_records_expires_at ON idem_records (expires_at);
CREATE INDEX idem_records_created_at ON idem_records (created_at);
"#,
    r#"
CREATE TABLE idem_fences (
    resource    TEXT    NOT NULL PRIMARY KEY,
    token       INTEGER NOT NULL CHECK (token > 0),
    lease_until INTEGER NOT NULL,
    updated_at  INTEGER NOT NULL
) WITHOUT ROWID;
"#,
];

/// The schema version this build writes.
pub const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// Brings the database up to [`SCHEMA_VERSION`]. Refuses a database written by a
/// newer version rather than guessing.
pub fn migrate(conn: &mut Connection) -> Result<(), Error> {
    loop {
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(|e| map_err("start a migration", e))?;
        let version: i64 = tx
            .pragma_query_value(None, "user_version", |row| row.get(0))
            .map_err(|e| map_err("read the schema version", e))?;
        if version > SCHEMA_VERSION {
            return Err(idem_core::StoreError::new(
                idem_core::ErrorKind::Corrupt,
                format!(
                    "the database has schema version {version}, newer than this build's {SCHEMA_VERSION}; upgrade idem"
                ),
            )
            .into());
        }
        if version == SCHEMA_VERSION {
            return Ok(());
        }
        let step = MIGRATIONS[usize::try_from(version).expect("schema version is not negative")];
        tx.execute_batch(step)
            .map_err(|e| map_err("apply a migration", e))?;
        tx.pragma_update(None, "user_version", version + 1)
            .map_err(|e| map_err("record the schema version", e))?;
        tx.commit().map_err(|e| map_err("commit a migration", e))?;
    }
}
