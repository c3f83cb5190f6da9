//! The statements of atomic apply's locked path, prepared once per session
//! with SQL `PREPARE` and run with `EXECUTE` inside simple queries.
//!
//! Why: the locked path sends several statements in one round trip (`BEGIN`,
//! the lock, the read; later the write and `COMMIT`), which only a simple query
//! can do, and a simple query cannot use the extended protocol's prepared
//! statements. Written out in full, the read and the write would be parsed and
//! planned on every call, which costs more on the server than the round trip
//! saved. `EXECUTE name(literals)` runs a plan the session already has, and
//! only its literal arguments are parsed (see [`literal`] for why they are
//! safe).
//!
//! The statements are prepared when a connection of the store's own pool opens
//! (`PgStoreBuilder::connect`), and otherwise on first use: an `EXECUTE` of a
//! statement the session does not have fails with [`STATEMENT_MISSING`], and
//! the caller then runs [`prepare_session`] and tries again. Each path checks
//! for this at its first statement, before any effect runs: the read under
//! the lock. The order in which they are prepared (see `STATEMENTS`) makes a
//! session that has the read have the writes that follow it. Sessions lose them all at once (`DISCARD ALL`,
//! `DEALLOCATE ALL`, a new connection); one dropped by name is found only when
//! it is run, and that apply fails and rolls back.

use idem_core::{
    Claim, FencingToken, Fingerprint, IdempotencyKey, Outcome, Record, RecordState, Scope,
    Timestamp,
};
use sqlx::AssertSqlSafe;
use sqlx::postgres::{PgConnection, PgRow};

use super::row;
use crate::{literal, lock};

/// Name of the prepared read of one record.
macro_rules! fetch_name {
    () => {
        "idem_fetch_v1"
    };
}

/// Name of the prepared insert of a new record.
macro_rules! insert_name {
    () => {
        "idem_insert_v1"
    };
}

/// Name of the prepared replacement of a record read under the lock.
macro_rules! replace_name {
    () => {
        "idem_replace_v1"
    };
}

/// Name of the prepared one-statement claim of a key.
macro_rules! claim_name {
    () => {
        "idem_claim_v2"
    };
}

/// Name of the prepared fenced settlement of an in-flight record.
macro_rules! settle_name {
    () => {
        "idem_settle_v1"
    };
}

/// The parameter types of a whole record, in the order of `record_columns!()`.
macro_rules! record_types {
    () => {
        "(text, text, bytea, text, bigint, bigint, text, bytea, text, bigint, bigint, bigint)"
    };
}

/// Every prepared statement, by name, in the order they are prepared. A
/// statement that fails to prepare leaves the ones before it prepared, so a
/// session that has a statement has every one before it: the read (what
/// every locked path runs first) comes after the writes.
const STATEMENTS: [(&str, &str); 5] = [
    (
        settle_name!(),
        concat!(
            "PREPARE ",
            settle_name!(),
            " (text, text, bigint, text, text, bytea, text, bigint) AS \
             WITH current AS (SELECT token FROM idem_records WHERE scope = $1 AND key = $2), \
             changed AS ( \
               UPDATE idem_records SET state = $4, outcome_kind = $5, outcome_body = $6, \
                 outcome_meta = $7, lease_until = NULL, updated_at = $8 \
               WHERE scope = $1 AND key = $2 AND token = $3 AND state = 'in_flight' \
               RETURNING 1) \
             SELECT EXISTS (SELECT 1 FROM changed) AS held, (SELECT token FROM current) AS current"
        ),
    ),
    (
        insert_name!(),
        concat!(
            "PREPARE ",
            insert_name!(),
            " ",
            record_types!(),
            " AS INSERT INTO idem_records (",
            record_columns!(),
            ") VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)"
        ),
    ),
    (
        replace_name!(),
        concat!(
            "PREPARE ",
            replace_name!(),
            " ",
            record_types!(),
            " AS WITH written AS (INSERT INTO idem_records (",
            record_columns!(),
            ") VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12) ",
            replace_if_newer!(),
            " RETURNING 1) SELECT 1 / count(*)::int AS written FROM written"
        ),
    ),
    (
        claim_name!(),
        concat!(
            "PREPARE ",
            claim_name!(),
            // $1 scope, $2 key, $3 fingerprint, $4 the token of a first claim
            // now, $5 the lease's end, $6 now, $7 the end of a window
            // starting now, $8 the key's advisory lock.
            " (text, text, bytea, bigint, bigint, bigint, bigint, bigint) AS \
             INSERT INTO idem_records AS r (",
            record_columns!(),
            ") SELECT $1, $2, $3, 'in_flight', $4, $5, NULL::text, NULL::bytea, NULL::text, \
               $6, $6, $7 \
             WHERE pg_try_advisory_xact_lock($8) \
             ON CONFLICT (scope, key) DO UPDATE SET \
               fingerprint = EXCLUDED.fingerprint, state = 'in_flight', \
               token = CASE WHEN r.expires_at <= $6 THEN GREATEST(r.token + 1, $4) ELSE r.token + 1 END, \
               lease_until = EXCLUDED.lease_until, outcome_kind = NULL, outcome_body = NULL, \
               outcome_meta = NULL, \
               created_at = CASE WHEN r.expires_at <= $6 THEN $6 ELSE r.created_at END, \
               updated_at = $6, \
               expires_at = CASE WHEN r.expires_at <= $6 THEN $7 ELSE r.expires_at END \
             WHERE r.expires_at <= $6 \
                OR (r.state = 'in_flight' AND r.lease_until IS NULL AND r.fingerprint = $3) \
             RETURNING token, created_at, expires_at"
        ),
    ),
    (
        fetch_name!(),
        concat!(
            "PREPARE ",
            fetch_name!(),
            " (text, text) AS SELECT ",
            record_columns!(),
            " FROM idem_records WHERE scope = $1 AND key = $2"
        ),
    ),
];

/// The SQLSTATE (`invalid_sql_statement_name`) of an `EXECUTE` whose statement
/// this session has not prepared.
pub(crate) const STATEMENT_MISSING: &str = "26000";

/// The SQLSTATE (`unique_violation`) with which [`execute_insert`] fails when
/// the key has a record after all.
pub(crate) const INSERT_FAILED: &str = "23505";

/// The SQLSTATE (`division_by_zero`) with which [`execute_replace`] fails when
/// its upsert wrote nothing.
pub(crate) const REPLACE_FAILED: &str = "22012";

/// Every statement's `PREPARE`, as one simple query's text: what a
/// transaction through a pooler begins with, since it may be on a server
/// connection that has none of them, or a stale set (see `pooler`).
///
/// The one-statement claim is left out: through a pooler it is not used
/// (see `PgStore::claims_in_one_statement`).
pub(crate) fn prepare_statements() -> String {
    STATEMENTS
        .iter()
        .filter(|(name, _)| *name != claim_name!())
        .map(|(_, sql)| *sql)
        .collect::<Vec<_>>()
        .join("; ")
}

/// Prepares, on this session, whichever of the statements it does not have
/// yet.
pub(crate) async fn prepare_session(conn: &mut PgConnection) -> sqlx::Result<()> {
    let names: Vec<&str> = STATEMENTS.iter().map(|(name, _)| *name).collect();
    let present: Vec<String> =
        sqlx::query_scalar("SELECT name FROM pg_prepared_statements WHERE name = ANY($1)")
            .bind(&names)
            .fetch_all(&mut *conn)
            .await?;
    let missing: Vec<&str> = STATEMENTS
        .iter()
        .filter(|(name, _)| !present.iter().any(|p| p == name))
        .map(|(_, sql)| *sql)
        .collect();
    if !missing.is_empty() {
        sqlx::raw_sql(AssertSqlSafe(missing.join("; ")))
            .execute(&mut *conn)
            .await?;
    }
    Ok(())
}

/// Reads the record of `(scope, key)`: 0 or 1 row, for [`from_row`].
pub(crate) fn execute_fetch(scope: &Scope, key: &IdempotencyKey) -> String {
    format!(
        concat!("EXECUTE ", fetch_name!(), "({}, {})"),
        literal::text(scope.as_str()),
        literal::text(key.as_str())
    )
}

/// Reads the record of `(scope, key)` in one simple query, for a connection
/// outside any transaction through a pooler: the extended protocol's two
/// exchanges could reach two server connections (see `pooler`). The query's
/// two statements run in one implicit transaction, which `SET LOCAL` lasts
/// for, and which ends with the query, failed or not: the connection is
/// never left inside a transaction.
pub(crate) async fn fetch_alone<'e>(
    db: impl sqlx::PgExecutor<'e>,
    scope: &Scope,
    key: &IdempotencyKey,
) -> sqlx::Result<Option<Record>> {
    let sql = format!(
        concat!(
            "SET LOCAL bytea_output = hex; SELECT ",
            record_columns!(),
            " FROM idem_records WHERE scope = {} AND key = {}"
        ),
        literal::text(scope.as_str()),
        literal::text(key.as_str())
    );
    let rows = sqlx::raw_sql(AssertSqlSafe(sql)).fetch_all(db).await?;
    rows.first().map(row::record).transpose()
}

/// Inserts `record` for a key that had none when it was read under the lock.
///
/// Fails with [`INSERT_FAILED`] if the key has a record after all (something
/// wrote it without taking the key's lock): the error aborts the transaction,
/// so nothing is committed on the stale decision.
pub(crate) fn execute_insert(record: &Record) -> String {
    format!(
        concat!("EXECUTE ", insert_name!(), "({})"),
        row::literals(record)
    )
}

/// Replaces the record read under the lock with `record`, guarded like
/// [`write`](super::write): only a row with a smaller token is replaced.
///
/// Where `write` reports how many rows it wrote, this statement *fails* when
/// the guard wrote nothing: it divides by the count of written rows, raising
/// [`REPLACE_FAILED`] and aborting the transaction. The divisor is a row count,
/// not a constant, so the planner cannot fold it into an error raised in every
/// case.
pub(crate) fn execute_replace(record: &Record) -> String {
    format!(
        concat!("EXECUTE ", replace_name!(), "({})"),
        row::literals(record)
    )
}

/// How long the one-statement claim waits for a row lock (or for a
/// concurrent insert of the same key to commit) before it gives up and the
/// claim takes the locked path, which answers at once: a record being
/// completed inside a transaction (`complete_with`) stays locked while its
/// effect runs, and a duplicate is answered, not queued.
const CLAIM_LOCK_TIMEOUT: &str = "50ms";

/// The SQLSTATE (`lock_not_available`) of a claim that met
/// [`CLAIM_LOCK_TIMEOUT`].
pub(crate) const CLAIM_WAITED: &str = "55P03";

/// Claims `(scope, key)` in one statement, as one simple query (outside any
/// transaction: the query's statements are its own transaction): a key
/// without a record gets an in-flight one with the first token of `now`; a
/// record past its window is replaced by one (its token still grows); a
/// record released by its holder (in flight, no lease) with the same
/// fingerprint is claimed with the next token, keeping its window. The query
/// answers one row (`token`, `created_at`, `expires_at`) when it claimed,
/// none otherwise: then the record holds a stored answer, a live or ended
/// lease, another fingerprint, which the locked path decides on.
///
/// The statement also *tries* the key's advisory lock, and claims nothing
/// when another transaction holds it: an atomic apply (or a locked claim)
/// holds the lock of a key it is claiming from before its record exists
/// until it commits, and a leased claim meanwhile must be answered
/// `InFlight`, which the locked path does. The lock is taken and released
/// by this query's own transaction. The statement's snapshot is older than
/// the lock, but it reads nothing through it: the conflict on the key and the
/// `WHERE` of the update see the latest committed row.
///
/// A lease that ended is not taken over here: without the old row in
/// `RETURNING` (PostgreSQL 18 has it) the answer could not tell a takeover
/// from a claim after a release, and a takeover is what a caller reconciles.
pub(crate) fn execute_claim(
    scope: &Scope,
    key: &IdempotencyKey,
    fingerprint: &Fingerprint,
    first: FencingToken,
    lease_until: Timestamp,
    now: Timestamp,
    expires_at: Timestamp,
) -> String {
    format!(
        concat!(
            "SET LOCAL lock_timeout = '{}'; EXECUTE ",
            claim_name!(),
            "({}, {}, {}, {}, {}, {}, {}, {})"
        ),
        CLAIM_LOCK_TIMEOUT,
        literal::text(scope.as_str()),
        literal::text(key.as_str()),
        literal::bytea(fingerprint.as_bytes()),
        literal::bigint(Some(first.get())),
        literal::bigint(Some(lease_until.0)),
        literal::bigint(Some(now.0)),
        literal::bigint(Some(expires_at.0)),
        literal::bigint(Some(lock::lock_key(scope, key))),
    )
}

/// Settles the in-flight record of `claim` with `outcome` if the claim still
/// holds it, as [`settle`](super::settle) does; its one row is read with
/// [`fence`](super::fence).
pub(crate) fn execute_settle(claim: &Claim, outcome: &Outcome, now: Timestamp) -> String {
    format!(
        concat!(
            "EXECUTE ",
            settle_name!(),
            "({}, {}, {}, {}, {}, {}, {}, {})"
        ),
        literal::text(claim.scope.as_str()),
        literal::text(claim.key.as_str()),
        literal::bigint(Some(claim.token.get())),
        literal::text(RecordState::settled_by(outcome.kind).as_str()),
        literal::text(outcome.kind.as_str()),
        literal::bytea(&outcome.body),
        literal::text(&outcome.meta_json()),
        literal::bigint(Some(now.0)),
    )
}

/// A record from a row of [`execute_fetch`]. Rows of a simple query are text;
/// sqlx reads them all the same, `bytea` included as long as `bytea_output`
/// is `hex` (which the locked path sets for its transaction).
pub(crate) fn from_row(row: &PgRow) -> sqlx::Result<Record> {
    row::record(row)
}
