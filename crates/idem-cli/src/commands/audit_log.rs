//! `idem audit-log`: what operators changed by hand, newest first, for
//! people (a table) and scripts (`--json`).

use anyhow::Context;
use clap::Args;
use comfy_table::{Table, presets::UTF8_FULL_CONDENSED};
use idem::{AdminStore, AnyStore, AuditEntry, AuditSubject, Timestamp};
use serde_json::{Value, json};

use super::args::OutputArgs;

/// `idem audit-log`
#[derive(Debug, Args)]
pub(crate) struct AuditLogArgs {
    /// At most this many entries, newest first.
    #[arg(long, default_value_t = 100)]
    pub limit: usize,
    #[command(flatten)]
    pub output: OutputArgs,
}

fn time(t: Timestamp) -> String {
    humantime::format_rfc3339_seconds(t.to_system_time()).to_string()
}

/// The record or letter as it was, parsed (kept as text if it is not JSON).
fn before(entry: &AuditEntry) -> Value {
    serde_json::from_str(&entry.before).unwrap_or_else(|_| Value::from(entry.before.as_str()))
}

/// The letter's destination as stored, with its password and query removed.
fn redacted(mut before: Value) -> Value {
    if let Some(destination) = before.get_mut("destination")
        && let Some(text) = destination.as_str()
    {
        *destination = Value::from(idem_broker::publish::redact(text));
    }
    before
}

fn to_json(entry: &AuditEntry) -> Value {
    let (scope, key, dead_letter) = entry.subject.columns();
    json!({
        "id": entry.id,
        "at_ms": entry.at.0,
        "actor": entry.actor,
        "action": entry.action.as_str(),
        "scope": scope,
        "key": key,
        "dead_letter_id": dead_letter,
        "before": redacted(before(entry)),
    })
}

/// What the table says the record or letter was: its state and token, or
/// the letter's origin and error.
fn summary(entry: &AuditEntry) -> String {
    let before = before(entry);
    let field = |name: &str| match &before[name] {
        Value::String(s) => s.clone(),
        Value::Null => "-".to_owned(),
        other => other.to_string(),
    };
    match entry.subject {
        AuditSubject::Record { .. } => {
            format!("{}, token {}", field("state"), field("token"))
        }
        AuditSubject::DeadLetter { .. } => {
            let error = field("last_error");
            let error = error.lines().next().unwrap_or("");
            let error = if error.chars().count() > 50 {
                format!("{}…", error.chars().take(49).collect::<String>())
            } else {
                error.to_owned()
            };
            format!("from {}: {error}", field("origin"))
        }
    }
}

pub(crate) async fn run(store: &AnyStore, args: &AuditLogArgs) -> anyhow::Result<()> {
    let entries = store
        .audit_log(args.limit)
        .await
        .context("cannot read the audit log")?;
    if args.output.json {
        let all: Vec<Value> = entries.iter().map(to_json).collect();
        println!("{}", serde_json::to_string_pretty(&all)?);
        return Ok(());
    }
    if entries.is_empty() {
        println!("the audit log is empty: nothing was changed by hand");
        return Ok(());
    }
    let mut table = Table::new();
    table.load_preset(UTF8_FULL_CONDENSED).set_header([
        "id",
        "at",
        "actor",
        "action",
        "what",
        "as it was",
    ]);
    for entry in &entries {
        table.add_row([
            entry.id.to_string(),
            time(entry.at),
            entry.actor.clone(),
            entry.action.to_string(),
            entry.subject.to_string(),
            summary(entry),
        ]);
    }
    println!("{table}");
    println!("(`idem audit-log --json` shows each record or letter in full)");
    if entries.len() == args.limit {
        println!("(newest {} shown; use --limit for more)", args.limit);
    }
    Ok(())
}
