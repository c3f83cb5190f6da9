//! Rows of `idem_records` to and from [`Record`]s: the one place where the
//! table's text and numbers become typed values.
//!
//! Record states and outcome kinds are written with [`RecordState::as_str`] and
//! [`OutcomeKind::as_str`] and read back with their `FromStr`. A row that does
//! not hold a valid record is reported as [`BadRow`], which surfaces as
//! [`ErrorKind::Corrupt`](idem_core::ErrorKind::Corrupt).

use idem_core::{
    FencingToken, Fingerprint, IdempotencyKey, Outcome, OutcomeKind, Record, RecordState, Scope,
    Timestamp,
};
use sqlx::Row;
use sqlx::postgres::PgRow;

use crate::error::BadRow;
use crate::literal;

/// Reads `outcome_kind` back.
fn outcome_kind(text: &str) -> Result<OutcomeKind, sqlx::Error> {
    text.parse()
        .map_err(|e: idem_core::UnknownOutcomeKind| BadRow::into_sqlx(e.to_string()))
}

/// Reads a token column.
pub(crate) fn token(value: i64) -> Result<FencingToken, sqlx::Error> {
    FencingToken::new(value)
        .ok_or_else(|| BadRow::into_sqlx(format!("fencing token {value} is not positive")))
}

/// Reads a state column.
pub(crate) fn state(text: &str) -> Result<RecordState, sqlx::Error> {
    text.parse()
        .map_err(|e: idem_core::UnknownState| BadRow::into_sqlx(e.to_string()))
}

/// A tombstone's row (`scope, key, fingerprint, token, expired_at`) read as
/// the expired record it stands for, its end no later than `now`.
pub(crate) fn tombstone(row: &PgRow, now: Timestamp) -> Result<Record, sqlx::Error> {
    let (scope, key, fingerprint) = identity(row)?;
    let expired_at: i64 = row.try_get("expired_at")?;
    Ok(Record::tombstone(
        scope,
        key,
        fingerprint,
        token(row.try_get("token")?)?,
        Timestamp(expired_at).min(now),
    ))
}

/// The scope, key and fingerprint columns of a row.
fn identity(row: &PgRow) -> Result<(Scope, IdempotencyKey, Fingerprint), sqlx::Error> {
    let scope: String = row.try_get("scope")?;
    let key: String = row.try_get("key")?;
    let scope = Scope::new(scope).map_err(|e| BadRow::into_sqlx(e.to_string()))?;
    let key = IdempotencyKey::new(key).map_err(|e| BadRow::into_sqlx(e.to_string()))?;
    let fingerprint: Vec<u8> = row.try_get("fingerprint")?;
    let fingerprint = Fingerprint::from_slice(&fingerprint).ok_or_else(|| {
        BadRow::into_sqlx(format!(
            "fingerprint of {scope}/{key} is {} bytes, not 32",
            fingerprint.len()
        ))
    })?;
    Ok((scope, key, fingerprint))
}

/// A full record from a row selected with `record_columns!()`.
pub(crate) fn record(row: &PgRow) -> Result<Record, sqlx::Error> {
    let (scope, key, fingerprint) = identity(row)?;
    let kind: Option<String> = row.try_get("outcome_kind")?;
    let outcome = match kind {
        None => None,
        Some(kind) => {
            let body: Option<Vec<u8>> = row.try_get("outcome_body")?;
            let meta: Option<String> = row.try_get("outcome_meta")?;
            let meta = Outcome::parse_meta(meta.as_deref().unwrap_or("{}")).map_err(|e| {
                BadRow::into_sqlx(format!(
                    "outcome metadata of {scope}/{key} is not a JSON string map: {e}"
                ))
            })?;
            Some(Outcome {
                kind: outcome_kind(&kind)?,
                body: body.unwrap_or_default(),
                meta,
            })
        }
    };
    Ok(Record {
        fingerprint,
        state: state(row.try_get("state")?)?,
        token: token(row.try_get("token")?)?,
        lease_until: row.try_get::<Option<i64>, _>("lease_until")?.map(Timestamp),
        outcome,
        created_at: Timestamp(row.try_get("created_at")?),
        updated_at: Timestamp(row.try_get("updated_at")?),
        expires_at: Timestamp(row.try_get("expires_at")?),
        scope,
        key,
    })
}

/// Records laid out column by column, as the multi-row upsert binds them.
#[derive(Default)]
pub(crate) struct Columns {
    pub(crate) scope: Vec<String>,
    pub(crate) key: Vec<String>,
    pub(crate) fingerprint: Vec<Vec<u8>>,
    pub(crate) state: Vec<&'static str>,
    pub(crate) token: Vec<i64>,
    pub(crate) lease_until: Vec<Option<i64>>,
    pub(crate) outcome_kind: Vec<Option<&'static str>>,
    pub(crate) outcome_body: Vec<Option<Vec<u8>>>,
    pub(crate) outcome_meta: Vec<Option<String>>,
    pub(crate) created_at: Vec<i64>,
    pub(crate) updated_at: Vec<i64>,
    pub(crate) expires_at: Vec<i64>,
}

impl Columns {
    /// The columns of `records`.
    pub(crate) fn of(records: &[Record]) -> Self {
        let mut columns = Self::default();
        for r in records {
            columns.scope.push(r.scope.as_str().to_owned());
            columns.key.push(r.key.as_str().to_owned());
            columns.fingerprint.push(r.fingerprint.as_bytes().to_vec());
            columns.state.push(r.state.as_str());
            columns.token.push(r.token.get());
            columns.lease_until.push(r.lease_until.map(|t| t.0));
            columns
                .outcome_kind
                .push(r.outcome.as_ref().map(|o| o.kind.as_str()));
            columns
                .outcome_body
                .push(r.outcome.as_ref().map(|o| o.body.clone()));
            columns
                .outcome_meta
                .push(r.outcome.as_ref().map(Outcome::meta_json));
            columns.created_at.push(r.created_at.0);
            columns.updated_at.push(r.updated_at.0);
            columns.expires_at.push(r.expires_at.0);
        }
        columns
    }
}

/// A record's values as SQL literals, in the order of `record_columns!()`, for
/// a statement sent as a simple query (see [`literal`] for why they are safe).
pub(crate) fn literals(r: &Record) -> String {
    let outcome = r.outcome.as_ref();
    [
        literal::text(r.scope.as_str()),
        literal::text(r.key.as_str()),
        literal::bytea(r.fingerprint.as_bytes()),
        literal::text(r.state.as_str()),
        literal::bigint(Some(r.token.get())),
        literal::bigint(r.lease_until.map(|t| t.0)),
        literal::opt_text(outcome.map(|o| o.kind.as_str())),
        literal::opt_bytea(outcome.map(|o| o.body.as_slice())),
        literal::opt_text(outcome.map(Outcome::meta_json).as_deref()),
        literal::bigint(Some(r.created_at.0)),
        literal::bigint(Some(r.updated_at.0)),
        literal::bigint(Some(r.expires_at.0)),
    ]
    .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcome_kinds_are_read_back_and_unknown_ones_are_bad_rows() {
        for kind in OutcomeKind::ALL {
            assert_eq!(outcome_kind(kind.as_str()).unwrap(), kind);
        }
        let error = outcome_kind("ok").unwrap_err().to_string();
        assert!(error.contains("terminal_failure"), "{error}");
    }

    fn tricky_record() -> Record {
        let all_bytes: Vec<u8> = (0..=255).collect();
        let outcome = Outcome {
            kind: OutcomeKind::TerminalFailure,
            body: all_bytes,
            meta: [
                ("quote".to_owned(), "it's \"quoted\" \\ back".to_owned()),
                ("lines".to_owned(), "a\nb\u{1}".to_owned()),
                ("unicode".to_owned(), "née € 🦀".to_owned()),
            ]
            .into_iter()
            .collect(),
        };
        Record {
            scope: Scope::new(r"s'\").unwrap(),
            key: IdempotencyKey::new(r#"k'\"$$--;"#).unwrap(),
            fingerprint: Fingerprint::of_bytes(b"payload"),
            state: RecordState::Failed,
            token: FencingToken::new(i64::MAX).unwrap(),
            lease_until: None,
            outcome: Some(outcome),
            created_at: Timestamp(i64::MIN),
            updated_at: Timestamp(-1),
            expires_at: Timestamp(1_700_000_000_000),
        }
    }

    /// `literals` and `record` meet in a simple query: the literals go in,
    /// the server sends the row back as text, and sqlx decodes every column
    /// (text, bigint, bytea, NULL) into the same record.
    #[tokio::test]
    async fn a_record_survives_literals_and_a_text_row() {
        let Some(mut conn) = crate::testing::connect().await else {
            return;
        };
        let mut in_flight = tricky_record();
        in_flight.state = RecordState::InFlight;
        in_flight.outcome = None;
        in_flight.lease_until = Some(Timestamp(5));
        for record in [tricky_record(), in_flight] {
            let sql = format!(
                concat!(
                    "BEGIN; SET LOCAL bytea_output = hex; SELECT * FROM (VALUES ({})) AS r(",
                    record_columns!(),
                    "); ROLLBACK"
                ),
                literals(&record)
            );
            let rows = sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
                .fetch_all(&mut conn)
                .await
                .unwrap();
            assert_eq!(rows.len(), 1);
            assert_eq!(super::record(&rows[0]).unwrap(), record);
        }
    }

    /// Why the locked path sets `bytea_output`: sqlx reads `bytea` text only
    /// in hex, whatever the session says.
    #[tokio::test]
    async fn text_rows_need_hex_bytea_output() {
        let Some(mut conn) = crate::testing::connect().await else {
            return;
        };
        let record = tricky_record();
        let select = format!(
            concat!("SELECT * FROM (VALUES ({})) AS r(", record_columns!(), ")"),
            literals(&record)
        );
        let escaped = format!("SET bytea_output = escape; {select}");
        let rows = sqlx::raw_sql(sqlx::AssertSqlSafe(escaped))
            .fetch_all(&mut conn)
            .await
            .unwrap();
        assert!(super::record(&rows[0]).is_err());
        let local = format!("BEGIN; SET LOCAL bytea_output = hex; {select}; ROLLBACK");
        let rows = sqlx::raw_sql(sqlx::AssertSqlSafe(local))
            .fetch_all(&mut conn)
            .await
            .unwrap();
        assert_eq!(super::record(&rows[0]).unwrap(), record);
    }
}
