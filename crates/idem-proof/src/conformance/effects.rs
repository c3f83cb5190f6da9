//! Reading the server's effect count, before and after each rule, so a rule
//! can say how many of its requests were applied.
//!
//! # Why a count around each rule
//!
//! Answers alone cannot tell a replay from a second application that happens
//! to answer the same bytes; the effects can. Rules run one after the other,
//! and each reads the count before its first request and after its last
//! answer: the difference is what that rule's requests applied. Anything
//! else that applies effects on the server meanwhile (another client, a job)
//! is charged to the rule it falls in, so run the tester on a quiet server.

use std::path::PathBuf;

use idem::StoreLocation;
use serde_json::Value;

use super::client::Sender;
use super::config::EffectSource;

/// Why the count could not be read.
#[derive(Debug, thiserror::Error)]
#[error("cannot read the effect count from {source_name}: {problem}")]
pub struct EffectsError {
    /// The URL or the store.
    pub source_name: String,
    /// What went wrong, and what to do about it.
    pub problem: String,
}

/// Reads the count from `source`.
pub(crate) async fn count(sender: &Sender, source: &EffectSource) -> Result<u64, EffectsError> {
    match source {
        EffectSource::Url(uri) => {
            let error = |problem: String| EffectsError {
                source_name: uri.to_string(),
                problem,
            };
            let (status, body) = sender.get(uri).await.map_err(error)?;
            if !(200..300).contains(&status) {
                return Err(error(format!(
                    "it answered {status}; --effects-url must answer a GET with the count"
                )));
            }
            parse_count(&body).map_err(error)
        }
        EffectSource::Query { sql, store } => {
            let error = |problem: String| EffectsError {
                source_name: store.clone(),
                problem,
            };
            let location: StoreLocation = store.parse().map_err(|e: idem::LocationError| {
                error(format!(
                    "{e}; give --effects-store as sqlite://PATH or postgres://…"
                ))
            })?;
            let rows = match &location {
                StoreLocation::Sqlite(path) => {
                    let (path, sql): (PathBuf, String) = (path.clone(), sql.clone());
                    tokio::task::spawn_blocking(move || {
                        idem_check::effects::query::sqlite(&path, &sql)
                    })
                    .await
                    .map_err(|e| error(e.to_string()))?
                }
                StoreLocation::Postgres(url) => {
                    idem_check::effects::query::postgres(url, &location.to_string(), sql).await
                }
                StoreLocation::Redis(_) | StoreLocation::DynamoDb(_) => {
                    return Err(error(
                        "--effects-query runs SQL, and a Redis or DynamoDB store answers no SQL: give --effects-store as the sqlite://PATH or postgres://… database the effects are written to"
                            .to_owned(),
                    ));
                }
            };
            rows.map(|rows| rows.len() as u64)
                .map_err(|e| error(idem::error_chain(&e)))
        }
    }
}

/// A count as the effects URL answers it: a plain number, or JSON (a number
/// or an object with a numeric `count`).
fn parse_count(body: &[u8]) -> Result<u64, String> {
    let text = String::from_utf8_lossy(body);
    if let Ok(n) = text.trim().parse::<u64>() {
        return Ok(n);
    }
    let value: Value = serde_json::from_str(&text).map_err(|_| {
        format!(
            "it answered {:?}, not a count: answer a number or {{\"count\": N}}",
            shorten(&text)
        )
    })?;
    let count = match &value {
        Value::Object(object) => object.get("count"),
        other => Some(other),
    };
    count.and_then(Value::as_u64).ok_or_else(|| {
        format!("it answered {value}, not a count: answer a number or {{\"count\": N}}")
    })
}

fn shorten(text: &str) -> String {
    text.chars().take(80).collect()
}

#[cfg(test)]
mod tests {
    use super::parse_count;

    #[test]
    fn counts_are_read_plain_or_as_json() {
        assert_eq!(parse_count(b"12\n"), Ok(12));
        assert_eq!(parse_count(b"{\"count\": 3, \"other\": 1}"), Ok(3));
        assert!(
            parse_count(b"{\"total\": 3}")
                .unwrap_err()
                .contains("not a count")
        );
        assert!(parse_count(b"<html>").unwrap_err().contains("not a count"));
    }
}
