//! The effects query on a SQLite file, opened read-only.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rusqlite::types::ValueRef;
use rusqlite::{Connection, OpenFlags, Row};

use super::pages::{self, Pages};
use super::{Columns, QueryError};
use crate::effects::Effect;
use crate::effects::LoggedEffect;

/// Opens the SQLite database at `path` read-only: a missing file is an
/// error, not a new database.
fn open(path: &Path) -> Result<Connection, QueryError> {
    let unreachable = |source: rusqlite::Error| QueryError::Unreachable {
        location: format!("sqlite://{}", path.display()),
        source: source.into(),
    };
    let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = Connection::open_with_flags(path, flags).map_err(unreachable)?;
    conn.busy_timeout(Duration::from_secs(5))
        .map_err(unreachable)?;
    Ok(conn)
}

/// Runs `sql` on the SQLite database at `path`, read-only (a missing file is
/// an error, not a new database), and reads its rows as effects.
pub fn sqlite(path: &Path, sql: &str) -> Result<Vec<Effect>, QueryError> {
    let conn = open(path)?;
    let failed = |source: rusqlite::Error| QueryError::Failed(source.into());
    let mut statement = conn.prepare(sql).map_err(failed)?;
    let columns = Columns::find(statement.column_names())?;
    let mut rows = statement.query([]).map_err(failed)?;
    let mut effects = Vec::new();
    while let Some(row) = rows.next().map_err(failed)? {
        effects.push(columns.effect(effects.len() + 1, |i| text(row, i), |i| integer(row, i))?);
    }
    Ok(effects)
}

fn text(row: &Row<'_>, index: usize) -> Result<Option<String>, String> {
    match row.get_ref(index).map_err(|e| e.to_string())? {
        ValueRef::Null => Ok(None),
        ValueRef::Text(bytes) => String::from_utf8(bytes.to_vec())
            .map(Some)
            .map_err(|_| "is not UTF-8 text".to_owned()),
        ValueRef::Integer(number) => Ok(Some(number.to_string())),
        other => Err(format!("is {:?}, not text", other.data_type())),
    }
}

fn integer(row: &Row<'_>, index: usize) -> Result<Option<i64>, String> {
    match row.get_ref(index).map_err(|e| e.to_string())? {
        ValueRef::Null => Ok(None),
        ValueRef::Integer(number) => Ok(Some(number)),
        other => Err(format!("is {:?}, not an integer", other.data_type())),
    }
}

/// The effects query in pages on a SQLite file, on one read-only connection
/// kept open between pages.
#[derive(Debug, Clone)]
pub struct SqlitePages {
    conn: Arc<Mutex<Connection>>,
    pages: Pages,
}

impl SqlitePages {
    /// Opens the database at `path` read-only and checks that a page of
    /// `pages` prepares (the tables and columns exist, the cursor column is
    /// returned).
    pub fn open(path: &Path, pages: Pages) -> Result<Self, QueryError> {
        let conn = open(path)?;
        {
            let statement = conn
                .prepare(&pages.statement("?1", "?2"))
                .map_err(|source| QueryError::Failed(source.into()))?;
            pages.columns(statement.column_names())?;
        }
        Ok(Self {
            conn: Arc::new(Mutex::new(conn)),
            pages,
        })
    }

    /// At most `limit` rows past `after`, in cursor order, read on a
    /// blocking thread.
    pub async fn page(&self, after: i64, limit: usize) -> Result<Vec<LoggedEffect>, QueryError> {
        let (conn, pages) = (Arc::clone(&self.conn), self.pages.clone());
        tokio::task::spawn_blocking(move || {
            let conn = conn.lock().unwrap_or_else(|p| p.into_inner());
            read_page(&conn, &pages, after, limit)
        })
        .await
        .map_err(|join| QueryError::Failed(join.into()))?
    }
}

fn read_page(
    conn: &Connection,
    pages: &Pages,
    after: i64,
    limit: usize,
) -> Result<Vec<LoggedEffect>, QueryError> {
    let failed = |source: rusqlite::Error| QueryError::Failed(source.into());
    let mut statement = conn
        .prepare_cached(&pages.statement("?1", "?2"))
        .map_err(failed)?;
    let columns = pages.columns(statement.column_names())?;
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let mut rows = statement.query((after, limit)).map_err(failed)?;
    let mut effects = Vec::new();
    while let Some(row) = rows.next().map_err(failed)? {
        effects.push(pages::logged(
            columns,
            effects.len() + 1,
            |i| text(row, i),
            |i| integer(row, i),
        )?);
    }
    Ok(effects)
}
