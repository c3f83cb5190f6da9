//! The one place where SQLite's native errors become [`idem_core::ErrorKind`]s.

use idem_core::{Error, ErrorKind, StoreError};
use rusqlite::ErrorCode;

/// Maps a rusqlite error met while trying to `doing` something.
pub fn map_err(doing: &str, error: rusqlite::Error) -> Error {
    let kind = kind_of(&error);
    let hint = match kind {
        ErrorKind::Busy => {
            "; another process holds the write lock for longer than the busy timeout — raise it or use PostgreSQL for several processes"
        }
        ErrorKind::Unavailable => "; check that the directory exists and is writable",
        ErrorKind::Corrupt => "; the file is not an idem SQLite database of a known version",
        _ => "",
    };
    StoreError::with_source(kind, format!("could not {doing}: {error}{hint}"), error).into()
}

fn kind_of(error: &rusqlite::Error) -> ErrorKind {
    match error {
        rusqlite::Error::SqliteFailure(native, _) => match native.code {
            ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked => ErrorKind::Busy,
            ErrorCode::ConstraintViolation
                if matches!(
                    native.extended_code,
                    rusqlite::ffi::SQLITE_CONSTRAINT_PRIMARYKEY
                        | rusqlite::ffi::SQLITE_CONSTRAINT_UNIQUE
                ) =>
            {
                ErrorKind::UniqueViolation
            }
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
    }
}

/// A stored value that this version cannot read back.
pub fn corrupt(message: String) -> Error {
    StoreError::new(ErrorKind::Corrupt, message).into()
}
