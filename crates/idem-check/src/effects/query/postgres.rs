//! The effects query on PostgreSQL, on one connection of its own.

use sqlx::postgres::PgRow;
use sqlx::{AssertSqlSafe, Column, Connection, Executor, PgConnection, Row, SqlSafeStr};

use super::pages::{self, Pages};
use super::{Columns, QueryError};
use crate::effects::Effect;
use crate::effects::LoggedEffect;

/// Connects to `url`, runs `sql` and reads its rows as effects. Text
/// columns may be `text`, `varchar` or an integer; `fence` any integer type.
/// `location` names the database in errors (the URL without its password).
pub async fn postgres(url: &str, location: &str, sql: &str) -> Result<Vec<Effect>, QueryError> {
    let mut conn = PgConnection::connect(url)
        .await
        .map_err(|source| QueryError::Unreachable {
            location: location.to_owned(),
            source: source.into(),
        })?;
    let effects = read(&mut conn, sql).await;
    conn.close().await.ok();
    effects
}

/// Names the columns first, so that a query without `key` is refused even
/// when it returns no rows, then reads the rows.
async fn read(conn: &mut PgConnection, sql: &str) -> Result<Vec<Effect>, QueryError> {
    let failed = |source: sqlx::Error| QueryError::Failed(source.into());
    let described = (&mut *conn)
        .describe(AssertSqlSafe(sql.to_owned()).into_sql_str())
        .await
        .map_err(failed)?;
    let columns = Columns::find(described.columns().iter().map(|c| c.name()))?;
    let rows = sqlx::query(AssertSqlSafe(sql.to_owned()))
        .fetch_all(&mut *conn)
        .await
        .map_err(failed)?;
    rows.iter()
        .enumerate()
        .map(|(index, row)| columns.effect(index + 1, |i| text(row, i), |i| fence(row, i)))
        .collect()
}

fn text(row: &PgRow, index: usize) -> Result<Option<String>, String> {
    if let Ok(text) = row.try_get::<Option<String>, _>(index) {
        return Ok(text);
    }
    integer(row, index)
        .map(|number| number.map(|n| n.to_string()))
        .map_err(|_| "is neither text nor an integer; cast it with ::text".to_owned())
}

fn fence(row: &PgRow, index: usize) -> Result<Option<i64>, String> {
    integer(row, index).map_err(|_| "is not an integer; cast it with ::bigint".to_owned())
}

fn integer(row: &PgRow, index: usize) -> Result<Option<i64>, sqlx::Error> {
    row.try_get::<Option<i64>, _>(index)
        .or_else(|_| {
            row.try_get::<Option<i32>, _>(index)
                .map(|n| n.map(i64::from))
        })
        .or_else(|_| {
            row.try_get::<Option<i16>, _>(index)
                .map(|n| n.map(i64::from))
        })
}

/// The effects query in pages on PostgreSQL, on one connection of its own,
/// made again on the next page after it was lost.
#[derive(Debug)]
pub struct PgPages {
    url: String,
    location: String,
    pages: Pages,
    conn: Option<PgConnection>,
}

impl PgPages {
    /// Connects to `url` and checks that a page of `pages` is a valid
    /// statement that returns the cursor and the key. `location` names the
    /// database in errors (the URL without its password).
    pub async fn connect(url: &str, location: &str, pages: Pages) -> Result<Self, QueryError> {
        let mut reader = Self {
            url: url.to_owned(),
            location: location.to_owned(),
            pages,
            conn: None,
        };
        let statement = reader.pages.statement("$1::bigint", "$2::bigint");
        let conn = reader.connection().await?;
        let described = conn
            .describe(AssertSqlSafe(statement).into_sql_str())
            .await
            .map_err(|source| QueryError::Failed(source.into()))?;
        reader
            .pages
            .columns(described.columns().iter().map(|c| c.name()))?;
        Ok(reader)
    }

    async fn connection(&mut self) -> Result<&mut PgConnection, QueryError> {
        if self.conn.is_none() {
            let conn = PgConnection::connect(&self.url).await.map_err(|source| {
                QueryError::Unreachable {
                    location: self.location.clone(),
                    source: source.into(),
                }
            })?;
            self.conn = Some(conn);
        }
        Ok(self.conn.as_mut().expect("connected above"))
    }

    /// At most `limit` rows past `after`, in cursor order. A failed page
    /// drops the connection, so the next one connects anew.
    pub async fn page(
        &mut self,
        after: i64,
        limit: usize,
    ) -> Result<Vec<LoggedEffect>, QueryError> {
        let statement = self.pages.statement("$1::bigint", "$2::bigint");
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let conn = self.connection().await?;
        let rows = sqlx::query(AssertSqlSafe(statement))
            .bind(after)
            .bind(limit)
            .fetch_all(&mut *conn)
            .await;
        let rows = match rows {
            Ok(rows) => rows,
            Err(source) => {
                self.conn = None;
                return Err(QueryError::Failed(source.into()));
            }
        };
        let Some(first) = rows.first() else {
            return Ok(Vec::new());
        };
        let columns = self
            .pages
            .columns(first.columns().iter().map(|c| c.name()))?;
        rows.iter()
            .enumerate()
            .map(|(index, row)| {
                pages::logged(
                    columns,
                    index + 1,
                    |i| text(row, i),
                    |i| {
                        integer(row, i)
                            .map_err(|_| "is not an integer; cast it with ::bigint".to_owned())
                    },
                )
            })
            .collect()
    }
}
