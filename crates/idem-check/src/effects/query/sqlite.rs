//! The effects query on a SQLite file, opened read-only.

use std::path::Path;
use std::time::Duration;

use rusqlite::types::ValueRef;
use rusqlite::{Connection, OpenFlags};

use super::{Columns, QueryError};
use crate::effects::Effect;

/// Runs `sql` on the SQLite database at `path`, read-only (a missing file is
/// an error, not a new database), and reads its rows as effects.
pub fn sqlite(path: &Path, sql: &str) -> Result<Vec<Effect>, QueryError> {
    let unreachable = |source: rusqlite::Error| QueryError::Unreachable {
        location: format!("sqlite://{}", path.display()),
        source: source.into(),
    };
    let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = Connection::open_with_flags(path, flags).map_err(unreachable)?;
    conn.busy_timeout(Duration::from_secs(5))
        .map_err(unreachable)?;
    let failed = |source: rusqlite::Error| QueryError::Failed(source.into());
    let mut statement = conn.prepare(sql).map_err(failed)?;
    let columns = Columns::find(statement.column_names())?;
    let mut rows = statement.query([]).map_err(failed)?;
    let mut effects = Vec::new();
    while let Some(row) = rows.next().map_err(failed)? {
        let value = |index| row.get_ref(index).map_err(|e| e.to_string());
        let text = |index| match value(index)? {
            ValueRef::Null => Ok(None),
            ValueRef::Text(bytes) => String::from_utf8(bytes.to_vec())
                .map(Some)
                .map_err(|_| "is not UTF-8 text".to_owned()),
            ValueRef::Integer(number) => Ok(Some(number.to_string())),
            other => Err(format!("is {:?}, not text", other.data_type())),
        };
        let fence = |index| match value(index)? {
            ValueRef::Null => Ok(None),
            ValueRef::Integer(number) => Ok(Some(number)),
            other => Err(format!("is {:?}, not an integer", other.data_type())),
        };
        effects.push(columns.effect(effects.len() + 1, text, fence)?);
    }
    Ok(effects)
}
