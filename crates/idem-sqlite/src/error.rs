//! The one place where SQLite's native errors become [`idem_core::ErrorKind`]s.

use idem_core::{Error, ErrorKind, StoreError};
use rusqlite::ErrorCode;

/// Maps a rusqlite error met while trying to `doing` something.
pub fn map_error(doing: &str, error: rusqlite::Error) -> Error {
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

/// The kind of the first rusqlite error among `error` and its causes: how an
/// effect's failure is told apart when the database, not the effect, failed.
pub(crate) fn kind_of_cause(error: &(dyn std::error::Error + 'static)) -> Option<ErrorKind> {
    std::iter::successors(Some(error), |e| e.source())
        .find_map(|e| e.downcast_ref::<rusqlite::Error>())
        .map(kind_of)
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
pub(crate) fn corrupt(message: String) -> Error {
    StoreError::new(ErrorKind::Corrupt, message).into()
}

#[cfg(test)]
mod tests {
    use idem_testkit::errors::Wrapped;

    use super::*;

    #[test]
    fn an_effects_error_is_classified_through_its_causes() {
        let busy = rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_BUSY),
            None,
        );
        assert_eq!(kind_of_cause(&Wrapped(busy)), Some(ErrorKind::Busy));
        assert_eq!(
            kind_of_cause(&std::io::Error::other("no driver here")),
            None
        );
    }
}
