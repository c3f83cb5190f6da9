//! The SQLite schema and its migrations, versioned with `PRAGMA user_version`:
//! every table the store holds (records, fences, the outbox, dead letters,
//! consumers' failed attempts), in one sequence, so one version number says
//! what a file contains.
//!
//! Each migration runs in its own immediate transaction together with the
//! version bump, so a crash mid-migration leaves the previous version intact and
//! two processes opening the same file at once apply each step exactly once.

use rusqlite::{Connection, TransactionBehavior};

use crate::error::map_error;
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
    // 3: the transactional outbox (`outbox`). Databases written by earlier
    // versions of idem-broker may already hold this table, created by the
    // broker's own migrations with exactly these columns: `IF NOT EXISTS`
    // adopts it as it is, rows included.
    r#"
CREATE TABLE IF NOT EXISTS idem_outbox (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    destination  TEXT,
    key          TEXT    NOT NULL,
    payload      BLOB    NOT NULL,
    headers      TEXT    NOT NULL,
    state        TEXT    NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'sent')),
    attempts     INTEGER NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    last_error   TEXT,
    created_at   INTEGER NOT NULL,
    available_at INTEGER,
    lease_owner  TEXT,
    lease_until  INTEGER,
    sent_at      INTEGER
);
CREATE INDEX IF NOT EXISTS idem_outbox_pending ON idem_outbox (id) WHERE state = 'pending';
CREATE INDEX IF NOT EXISTS idem_outbox_sent_at ON idem_outbox (sent_at) WHERE state = 'sent';
"#,
    // 4: dead letters (`dead_letters`), adopted like the outbox when an
    // earlier idem-broker made them. `idem_broker_schema` was that broker's
    // record of its own migrations (the outbox and the dead letters, both
    // adopted by now); nothing reads it any more.
    r#"
CREATE TABLE IF NOT EXISTS idem_dead_letters (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    origin        TEXT    NOT NULL,
    destination   TEXT    NOT NULL,
    key           TEXT    NOT NULL,
    payload       BLOB    NOT NULL,
    headers       TEXT    NOT NULL,
    attempts      INTEGER NOT NULL CHECK (attempts >= 0),
    last_error    TEXT    NOT NULL,
    first_seen_at INTEGER NOT NULL,
    dead_at       INTEGER NOT NULL,
    redriven_at   INTEGER
);
CREATE INDEX IF NOT EXISTS idem_dead_letters_dead_at ON idem_dead_letters (dead_at);
DROP TABLE IF EXISTS idem_broker_schema;
"#,
    // 5: consumers' failed attempts (`attempts`). Earlier idem-broker
    // consumers created this table themselves when they started, with these
    // columns: adopted as it is.
    r#"
CREATE TABLE IF NOT EXISTS idem_consumer_attempts (
    scope      TEXT    NOT NULL,
    key        TEXT    NOT NULL,
    attempts   INTEGER NOT NULL,
    first_at   INTEGER NOT NULL,
    updated_at INTEGER NOT NULL,
    last_error TEXT    NOT NULL,
    PRIMARY KEY (scope, key)
);
"#,
    // 6: the audit log of what operators change by hand (`admin`), and
    // dead letters set aside by an operator (archived: kept, not waiting).
    r#"
CREATE TABLE idem_audit (
    id             INTEGER PRIMARY KEY AUTOINCREMENT,
    at             INTEGER NOT NULL,
    actor          TEXT    NOT NULL,
    action         TEXT    NOT NULL,
    scope          TEXT,
    key            TEXT    NOT NULL,
    dead_letter_id INTEGER,
    before         TEXT    NOT NULL,
    CHECK ((scope IS NULL) <> (dead_letter_id IS NULL))
);
ALTER TABLE idem_dead_letters ADD COLUMN archived_at INTEGER;
"#,
    // 7: tombstones, left by the sweep in place of records whose window
    // ended, while late retries are still refused (`Settings::tombstones`).
    r#"
CREATE TABLE idem_tombstones (
    scope       TEXT    NOT NULL,
    key         TEXT    NOT NULL,
    fingerprint BLOB    NOT NULL,
    token       INTEGER NOT NULL CHECK (token > 0),
    expired_at  INTEGER NOT NULL,
    PRIMARY KEY (scope, key)
) WITHOUT ROWID;
CREATE INDEX idem_tombstones_expired_at ON idem_tombstones (expired_at);
"#,
];

/// The schema version this build writes.
pub const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// Brings the database up to [`SCHEMA_VERSION`]. Refuses a database written by a
/// newer version rather than guessing.
pub(crate) fn migrate(conn: &mut Connection) -> Result<(), Error> {
    loop {
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(|e| map_error("start a migration", e))?;
        let version: i64 = tx
            .pragma_query_value(None, "user_version", |row| row.get(0))
            .map_err(|e| map_error("read the schema version", e))?;
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
            .map_err(|e| map_error("apply a migration", e))?;
        tx.pragma_update(None, "user_version", version + 1)
            .map_err(|e| map_error("record the schema version", e))?;
        tx.commit()
            .map_err(|e| map_error("commit a migration", e))?;
    }
}
