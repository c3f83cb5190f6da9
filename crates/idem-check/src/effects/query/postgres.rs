//! The effects query on PostgreSQL, on one connection of its own.

use sqlx::postgres::PgRow;
use sqlx::{AssertSqlSafe, Column, Connection, Executor, PgConnection, Row, SqlSafeStr};

use super::{Columns, QueryError};
use crate::effects::Effect;

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
