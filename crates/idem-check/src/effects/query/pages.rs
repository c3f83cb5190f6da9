//! The effects query read in pages past a cursor, the same way on every
//! database: the user's query becomes a subquery, filtered and ordered by
//! its cursor column and cut at a batch, so the database can use the
//! cursor's index and each page costs what its rows cost.

use super::{Columns, QueryError};
use crate::effects::{Effect, LoggedEffect};

/// The effects query as pages past a cursor: built once from the user's
/// query and the cursor column's name.
#[derive(Debug, Clone)]
pub struct Pages {
    sql: String,
    cursor: String,
}

impl Pages {
    /// Pages of `sql` by `cursor_column`. The query must not end with
    /// `LIMIT`; an `ORDER BY` in it is allowed and unneeded (pages come in
    /// cursor order). A trailing `;` is dropped.
    pub fn new(sql: &str, cursor_column: &str) -> Result<Self, QueryError> {
        let plain = !cursor_column.is_empty()
            && !cursor_column.starts_with(|c: char| c.is_ascii_digit())
            && cursor_column
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !plain {
            return Err(QueryError::BadCursorColumn(cursor_column.to_owned()));
        }
        let sql = sql.trim().trim_end_matches(';').trim_end().to_owned();
        Ok(Self {
            sql,
            cursor: cursor_column.to_owned(),
        })
    }

    /// The cursor column's name.
    pub fn cursor_column(&self) -> &str {
        &self.cursor
    }

    /// The statement of one page; `after` and `limit` are its placeholders
    /// (`?1`, `?2` on SQLite; `$1`, `$2` on PostgreSQL).
    pub(super) fn statement(&self, after: &str, limit: &str) -> String {
        let cursor = &self.cursor;
        format!(
            "SELECT * FROM ({sql}) AS idem_audit_effects WHERE \"{cursor}\" > {after} ORDER BY \"{cursor}\" LIMIT {limit}",
            sql = self.sql
        )
    }

    /// The columns of a page, found by name (the cursor's as given, the
    /// others as the effects query names them).
    pub(super) fn columns<'a>(
        &self,
        names: impl IntoIterator<Item = &'a str> + Clone,
    ) -> Result<(Columns, usize), QueryError> {
        let columns = Columns::find(names.clone())?;
        let cursor = names
            .clone()
            .into_iter()
            .position(|name| name.eq_ignore_ascii_case(&self.cursor))
            .ok_or_else(|| QueryError::NoCursorColumn {
                cursor: self.cursor.clone(),
                found: names.into_iter().collect::<Vec<_>>().join(", "),
            })?;
        Ok((columns, cursor))
    }
}

/// One row as a logged effect; `read_text` and `read_integer` read a column
/// of the row, `Ok(None)` for `NULL` and `Err(problem)` for a wrong type.
pub(super) fn logged(
    (columns, cursor): (Columns, usize),
    row: usize,
    read_text: impl Fn(usize) -> Result<Option<String>, String>,
    read_integer: impl Fn(usize) -> Result<Option<i64>, String>,
) -> Result<LoggedEffect, QueryError> {
    let value = |column: &'static str, problem: String| QueryError::Value {
        row,
        column,
        problem,
    };
    let cursor = read_integer(cursor)
        .map_err(|problem| value("cursor", problem))?
        .ok_or_else(|| value("cursor", "is NULL; every row needs its cursor".to_owned()))?;
    let at_ms = columns
        .at_ms
        .map(|index| read_integer(index).map_err(|problem| value("at_ms", problem)))
        .transpose()?
        .flatten();
    let effect: Effect = columns.effect(row, read_text, read_integer)?;
    Ok(LoggedEffect {
        cursor,
        at_ms,
        effect,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_page_wraps_the_query_and_refuses_a_cursor_that_is_not_a_name() {
        let pages = Pages::new("SELECT id, order_id AS key FROM ledger;\n", "id").unwrap();
        assert_eq!(
            pages.statement("?1", "?2"),
            "SELECT * FROM (SELECT id, order_id AS key FROM ledger) AS idem_audit_effects WHERE \"id\" > ?1 ORDER BY \"id\" LIMIT ?2"
        );
        for bad in ["", "1id", "id; DROP TABLE x", "a.b", "\"id\""] {
            assert!(
                matches!(
                    Pages::new("SELECT 1", bad),
                    Err(QueryError::BadCursorColumn(_))
                ),
                "{bad:?}"
            );
        }
    }
}
