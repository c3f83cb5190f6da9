//! The effect log as the rows of a query on the user's own database, for
//! systems whose effects are rows: `SELECT order_id AS key, account AS
//! resource, version AS fence FROM ledger ORDER BY id`.
//!
//! The query returns a column `key` (text, or an integer taken as text), and
//! optionally `scope`, `resource` (text) and `fence` (an integer); other
//! columns are ignored. Rows come in the order the query gives them, which
//! must be the commit order: the query says `ORDER BY`. A `NULL` in an
//! optional column is the same as the column being absent.
//!
//! The effect auditor reads the same query in pages instead ([`Pages`]):
//! the query also returns an integer cursor column that grows with every
//! row (an id), and optionally `at_ms`, when the effect was written
//! (milliseconds since the Unix epoch); each page is the rows past the last
//! cursor read, in cursor order, at most a batch of them.

mod pages;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "sqlite")]
mod sqlite;

pub use pages::Pages;
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub use postgres::{PgPages, postgres};
#[cfg(feature = "sqlite")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
pub use sqlite::{SqlitePages, sqlite};

use super::Effect;

/// A driver's error, kept as its source.
type Source = Box<dyn std::error::Error + Send + Sync>;

/// Why the effect log could not be read from the database.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum QueryError {
    /// The database could not be opened or reached.
    #[error("cannot reach the store at {location}")]
    Unreachable {
        /// The database, without its password.
        location: String,
        /// What the driver said.
        #[source]
        source: Source,
    },
    /// The database refused or failed the query.
    #[error("the effects query failed")]
    Failed(#[source] Source),
    /// The cursor column is not a plain column name.
    #[error(
        "the cursor column {0:?} is not a column name; give the name (letters, digits and _) of the integer column the query returns that grows with every row, such as id"
    )]
    BadCursorColumn(String),
    /// The query returns no cursor column.
    #[error(
        "the effects query returns no column {cursor:?} (it returns: {found}); return the integer that grows with every row under that name, or name it with --cursor-column"
    )]
    NoCursorColumn {
        /// The cursor column asked for.
        cursor: String,
        /// The columns it returns, comma-separated.
        found: String,
    },
    /// The query returns no `key` column.
    #[error(
        "the effects query returns no column \"key\" (it returns: {found}); name the key column with AS key"
    )]
    NoKeyColumn {
        /// The columns it returns, comma-separated.
        found: String,
    },
    /// A value that is not of its column's type.
    #[error("row {row} of the effects query: column {column:?} {problem}")]
    Value {
        /// 1-based.
        row: usize,
        /// The column.
        column: &'static str,
        /// What is wrong with it.
        problem: String,
    },
}

/// The columns of an effect, by their position in the query's rows.
#[derive(Debug, Clone, Copy)]
struct Columns {
    key: usize,
    scope: Option<usize>,
    resource: Option<usize>,
    fence: Option<usize>,
    at_ms: Option<usize>,
}

impl Columns {
    /// Finds the columns by name, ignoring case.
    fn find<'a>(names: impl IntoIterator<Item = &'a str> + Clone) -> Result<Self, QueryError> {
        let position = |wanted: &str| {
            names
                .clone()
                .into_iter()
                .position(|name| name.eq_ignore_ascii_case(wanted))
        };
        let key = position("key").ok_or_else(|| QueryError::NoKeyColumn {
            found: names.clone().into_iter().collect::<Vec<_>>().join(", "),
        })?;
        Ok(Self {
            key,
            scope: position("scope"),
            resource: position("resource"),
            fence: position("fence"),
            at_ms: position("at_ms"),
        })
    }

    /// One row as an effect; `read_text` and `read_fence` read a column of
    /// the row, `Ok(None)` for `NULL` and `Err(problem)` for a wrong type.
    fn effect(
        self,
        row: usize,
        read_text: impl Fn(usize) -> Result<Option<String>, String>,
        read_fence: impl Fn(usize) -> Result<Option<i64>, String>,
    ) -> Result<Effect, QueryError> {
        let value = |column: &'static str, problem: String| QueryError::Value {
            row,
            column,
            problem,
        };
        let optional = |column: &'static str, index: Option<usize>| {
            index
                .map(|index| read_text(index).map_err(|problem| value(column, problem)))
                .transpose()
                .map(Option::flatten)
        };
        let key = read_text(self.key)
            .map_err(|problem| value("key", problem))?
            .ok_or_else(|| value("key", "is NULL; every effect needs its key".to_owned()))?;
        Ok(Effect {
            key,
            scope: optional("scope", self.scope)?,
            resource: optional("resource", self.resource)?,
            fence: self
                .fence
                .map(|index| read_fence(index).map_err(|problem| value("fence", problem)))
                .transpose()?
                .flatten(),
        })
    }
}
