//! `idem keys ls` and `idem keys show`: what the store holds, for people (a
//! table) and scripts (`--json`). `idem keys rm` and `idem keys release`:
//! evict a key, end a stuck claim, each shown first, confirmed, and logged
//! in the store's audit log.

use std::time::SystemTime;

use anyhow::Context;
use clap::{Args, Subcommand, ValueEnum};
use comfy_table::{Table, presets::UTF8_FULL_CONDENSED};
use idem::{
    AdminStore, AnyStore, IdempotencyKey, Outcome, Record, RecordAction, RecordFilter, RecordState,
    RecordStore, Scope, Timestamp,
};
use idem_console::view::{RecordView, WHOLE_BODY};

use super::args::{ConfirmArgs, OutputArgs};
use super::confirm::{actor, confirm};

/// `idem keys ...`
#[derive(Debug, Subcommand)]
pub(crate) enum KeysCommand {
    /// List records, newest first.
    Ls(LsArgs),
    /// Show one record in full.
    Show(ShowArgs),
    /// Evict a key: show its record, remove it (after a confirmation, or
    /// with --yes) and log it in the audit log. The key's next use applies
    /// its effect again.
    Rm(ChangeArgs),
    /// End a stuck in-flight claim now: its token is fenced (the holder's
    /// completion is refused) and the next claim runs at once with a
    /// greater token. Logged in the audit log.
    Release(ChangeArgs),
}

/// `idem keys ls`
#[derive(Debug, Args)]
pub(crate) struct LsArgs {
    /// Only this scope.
    #[arg(long)]
    pub scope: Option<String>,
    /// Only this state.
    #[arg(long, value_enum)]
    pub state: Option<StateArg>,
    /// At most this many records.
    #[arg(long, default_value_t = 100)]
    pub limit: usize,
    #[command(flatten)]
    pub output: OutputArgs,
}

/// `idem keys show`
#[derive(Debug, Args)]
pub(crate) struct ShowArgs {
    /// The record's scope.
    pub scope: String,
    /// The idempotency key.
    pub key: String,
    #[command(flatten)]
    pub output: OutputArgs,
}

/// `idem keys rm` and `idem keys release`
#[derive(Debug, Args)]
pub(crate) struct ChangeArgs {
    /// The record's scope, as `idem keys ls` shows it (a principal's hash
    /// stays a hash).
    pub scope: String,
    /// The idempotency key.
    pub key: String,
    #[command(flatten)]
    pub confirm: ConfirmArgs,
}

/// A record state, as typed on the command line.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub(crate) enum StateArg {
    /// Claimed, effect running (or its worker died).
    #[value(name = "in_flight", alias = "in-flight")]
    InFlight,
    /// Applied; replayed to duplicates.
    Completed,
    /// Failed terminally; replayed to duplicates.
    Failed,
}

/// Runs `idem keys …`.
pub(crate) async fn run(store: &AnyStore, command: &KeysCommand) -> anyhow::Result<()> {
    match command {
        KeysCommand::Ls(args) => list(store, args).await,
        KeysCommand::Show(args) => show(store, args).await,
        KeysCommand::Rm(args) => remove(store, args).await,
        KeysCommand::Release(args) => release(store, args).await,
    }
}

fn state(arg: StateArg) -> RecordState {
    match arg {
        StateArg::InFlight => RecordState::InFlight,
        StateArg::Completed => RecordState::Completed,
        StateArg::Failed => RecordState::Failed,
    }
}

fn time(t: Timestamp) -> String {
    humantime::format_rfc3339_seconds(t.to_system_time()).to_string()
}

fn lease(record: &Record) -> String {
    match record.lease_until {
        None if record.state == RecordState::InFlight => "released".into(),
        None => "-".into(),
        Some(until) => {
            let now = SystemTime::now();
            match until.to_system_time().duration_since(now) {
                Ok(left) => format!("{}s left", left.as_secs()),
                Err(_) => "ended".into(),
            }
        }
    }
}

fn body_text(outcome: &Outcome) -> String {
    match std::str::from_utf8(&outcome.body) {
        Ok(text) => text.to_owned(),
        Err(_) => format!("<{} bytes of binary data>", outcome.body.len()),
    }
}

fn preview(outcome: Option<&Outcome>) -> String {
    let Some(outcome) = outcome else {
        return "-".into();
    };
    let text = body_text(outcome);
    if text.chars().count() > 40 {
        format!("{}…", text.chars().take(39).collect::<String>())
    } else {
        text
    }
}

/// The record as scripts get it: the console's view, its body whole.
fn to_json(record: &Record) -> RecordView {
    RecordView::of(record, idem::Clock::now(&idem::SystemClock), WHOLE_BODY)
}

async fn list(store: &AnyStore, args: &LsArgs) -> anyhow::Result<()> {
    let filter = RecordFilter {
        scope: args.scope.as_deref().map(Scope::new).transpose()?,
        state: args.state.map(state),
        limit: Some(args.limit),
        ..RecordFilter::default()
    };
    let records = store.list(&filter).await.context("cannot list records")?;
    if args.output.json {
        let all: Vec<RecordView> = records.iter().map(to_json).collect();
        println!("{}", serde_json::to_string_pretty(&all)?);
        return Ok(());
    }
    if records.is_empty() {
        println!("no records match");
        return Ok(());
    }
    let mut table = Table::new();
    table.load_preset(UTF8_FULL_CONDENSED).set_header([
        "scope", "key", "state", "token", "created", "expires", "lease", "outcome",
    ]);
    for r in &records {
        table.add_row([
            r.scope.to_string(),
            r.key.to_string(),
            r.state.to_string(),
            r.token.to_string(),
            time(r.created_at),
            time(r.expires_at),
            lease(r),
            preview(r.outcome.as_ref()),
        ]);
    }
    println!("{table}");
    if records.len() == args.limit {
        println!("(first {} shown; use --limit for more)", args.limit);
    }
    Ok(())
}

async fn show(store: &AnyStore, args: &ShowArgs) -> anyhow::Result<()> {
    let scope = Scope::new(args.scope.as_str())?;
    let key = IdempotencyKey::new(args.key.as_str())?;
    let record = store
        .get(&scope, &key)
        .await
        .context("cannot read the record")?
        .with_context(|| format!("no record for key {key} in scope {scope}"))?;
    if args.output.json {
        println!("{}", serde_json::to_string_pretty(&to_json(&record))?);
        return Ok(());
    }
    println!("{}", record_table(&record));
    Ok(())
}

/// One record in full, a row per field.
fn record_table(record: &Record) -> Table {
    let mut table = Table::new();
    table.load_preset(UTF8_FULL_CONDENSED);
    let mut rows = vec![
        ("scope", record.scope.to_string()),
        ("key", record.key.to_string()),
        ("state", record.state.to_string()),
        ("token", record.token.to_string()),
        ("fingerprint", record.fingerprint.to_hex()),
        ("created", time(record.created_at)),
        ("updated", time(record.updated_at)),
        ("expires", time(record.expires_at)),
        ("lease", lease(record)),
    ];
    if let Some(outcome) = &record.outcome {
        rows.push((
            "outcome",
            if outcome.is_failure() {
                "terminal failure"
            } else {
                "success"
            }
            .into(),
        ));
        for (name, value) in &outcome.meta {
            rows.push(("meta", format!("{name}: {value}")));
        }
        rows.push(("body", body_text(outcome)));
    }
    for (name, value) in rows {
        table.add_row([name.to_owned(), value]);
    }
    table
}

/// The record of the scope and key `args` name, or an error saying there is none.
async fn stored(store: &AnyStore, args: &ChangeArgs) -> anyhow::Result<Record> {
    let scope = Scope::new(args.scope.as_str())?;
    let key = IdempotencyKey::new(args.key.as_str())?;
    store
        .get(&scope, &key)
        .await
        .context("cannot read the record")?
        .with_context(|| {
            format!(
                "no record for key {key} in scope {scope}; `idem keys ls` lists them (name the scope as it shows it)"
            )
        })
}

/// What a change found, when it was not done.
fn not_done(answer: RecordAction, seen: &Record) -> anyhow::Error {
    let at = format!("key {} in scope {}", seen.key, seen.scope);
    match answer {
        RecordAction::Done(_) => unreachable!("a change that was done is not refused"),
        RecordAction::Missing => {
            anyhow::anyhow!("the record of {at} is gone already; nothing changed")
        }
        RecordAction::Changed(now) => anyhow::anyhow!(
            "the record of {at} changed since it was shown (it is {} now, token {}); nothing changed: run the command again to see it as it is",
            now.state,
            now.token
        ),
        RecordAction::NotHeld(now) => not_held(&now),
    }
}

/// Why `record` has no claim to end.
fn not_held(record: &Record) -> anyhow::Error {
    let at = format!("key {} in scope {}", record.key, record.scope);
    if record.state == RecordState::InFlight {
        anyhow::anyhow!(
            "the claim on {at} was released already (token {}): the next claim takes the key at once, so there is nothing to end",
            record.token
        )
    } else {
        anyhow::anyhow!(
            "{at} is {}, not in flight: there is no claim to end (`idem keys rm` evicts the record, so the key applies anew)",
            record.state
        )
    }
}

async fn remove(store: &AnyStore, args: &ChangeArgs) -> anyhow::Result<()> {
    let record = stored(store, args).await?;
    let actor = actor(&args.confirm)?;
    println!("{}", record_table(&record));
    let mut what = format!(
        "would remove the record of key {} in scope {}: the key's next use applies its effect again",
        record.key, record.scope
    );
    if idem::is_held(&record) {
        what.push_str(
            "; the claim's holder, if still running, has its completion refused (fenced)",
        );
    }
    if !args.confirm.yes {
        println!("{what}");
    }
    confirm(&args.confirm, "remove it")?;
    match store
        .evict(&record, &actor)
        .await
        .context("cannot remove the record")?
    {
        RecordAction::Done(entry) => {
            println!(
                "removed key {} in scope {}; audit entry {} by {}",
                record.key, record.scope, entry.id, entry.actor
            );
            Ok(())
        }
        other => Err(not_done(other, &record)),
    }
}

async fn release(store: &AnyStore, args: &ChangeArgs) -> anyhow::Result<()> {
    let record = stored(store, args).await?;
    if !idem::is_held(&record) {
        return Err(not_held(&record));
    }
    let actor = actor(&args.confirm)?;
    println!("{}", record_table(&record));
    if !args.confirm.yes {
        println!(
            "would end the claim on key {} in scope {}: token {} is fenced (its holder's completion is refused) and the next claim runs at once with a greater token",
            record.key, record.scope, record.token
        );
    }
    confirm(&args.confirm, "end the claim")?;
    match store
        .release_claim(&record, &actor)
        .await
        .context("cannot end the claim")?
    {
        RecordAction::Done(entry) => {
            println!(
                "released key {} in scope {}: token {} is fenced, the next claim gets a token above {}; audit entry {} by {}",
                record.key,
                record.scope,
                record.token,
                record.token.next(),
                entry.id,
                entry.actor
            );
            Ok(())
        }
        other => Err(not_done(other, &record)),
    }
}
