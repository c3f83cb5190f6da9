//! The one place where this crate's database errors become
//! [`idem_core::Error`]s: rusqlite's on the embedded store, sqlx's on
//! PostgreSQL. The outbox and dead-letter code decides on the
//! [`ErrorKind`] only, like the stores do.

use idem::sqlite::rusqlite;
use idem_core::{Error, ErrorKind, StoreError};

/// Maps a rusqlite error met while trying to `doing` something.
pub(crate) fn sqlite(doing: &str, error: rusqlite::Error) -> Error {
    use rusqlite::ErrorCode;
    let kind = match &error {
        rusqlite::Error::SqliteFailure(native, _) => match native.code {
            ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked => ErrorKind::Busy,
            ErrorCode::ConstraintViolation => ErrorKind::UniqueViolation,
            ErrorCode::CannotOpen | ErrorCode::ReadOnly | ErrorCode::SystemIoFailure => {
                ErrorKind::Unavailable
            }
            ErrorCode::NotADatabase | ErrorCode::DatabaseCorrupt => ErrorKind::Corrupt,
            _ => ErrorKind::Other,
        },
        rusqlite::Error::FromSqlConversionFailure(..)
        | rusqlite::Error::InvalidColumnType(..)
        | rusqlite::Error::InvalidColumnName(_)
        | rusqlite::Error::IntegralValueOutOfRange(..) => ErrorKind::Corrupt,
        _ => ErrorKind::Other,
    };
    StoreError::with_source(kind, format!("could not {doing}: {error}"), error).into()
}

/// Maps a sqlx error met while trying to `doing` something.
pub(crate) fn postgres(doing: &str, error: sqlx::Error) -> Error {
    use sqlx::Error as E;
    let kind = match &error {
        E::Io(_) | E::PoolTimedOut | E::PoolClosed | E::WorkerCrashed => ErrorKind::Unavailable,
        E::Tls(_) | E::Configuration(_) => ErrorKind::Config,
        E::Database(db) => match db.code().as_deref().unwrap_or_default() {
            "23505" => ErrorKind::UniqueViolation,
            "40001" | "40P01" => ErrorKind::SerializationFailure,
            "55P03" => ErrorKind::Busy,
            "57P01" | "57P02" | "57P03" | "53300" => ErrorKind::Unavailable,
            c if c.starts_with("08") => ErrorKind::Unavailable,
            "42P01" | "42703" => ErrorKind::Corrupt,
            _ => ErrorKind::Other,
        },
        E::Decode(_) | E::ColumnDecode { .. } | E::ColumnNotFound(_) => ErrorKind::Corrupt,
        _ => ErrorKind::Other,
    };
    StoreError::with_source(kind, format!("could not {doing}: {error}"), error).into()
}

/// A stored value this version cannot read back.
pub(crate) fn corrupt(message: impl Into<String>) -> Error {
    StoreError::new(ErrorKind::Corrupt, message).into()
}

/// Headers as the JSON text the tables keep.
pub(crate) fn headers_json(headers: &std::collections::BTreeMap<String, String>) -> String {
    serde_json::to_string(headers).expect("a string map always serializes")
}

/// Headers read back from their JSON text.
pub(crate) fn parse_headers(
    text: &str,
) -> Result<std::collections::BTreeMap<String, String>, Error> {
    serde_json::from_str(text).map_err(|e| {
        corrupt(format!(
            "stored headers are not a JSON object of strings: {e}"
        ))
    })
}

/// The error for a store kind this crate was built without.
pub(crate) fn unsupported_store() -> Error {
    StoreError::new(
        ErrorKind::Config,
        "this store kind is not supported by idem-broker",
    )
    .into()
}
