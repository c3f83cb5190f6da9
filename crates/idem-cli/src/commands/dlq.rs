//! `idem dlq ls | show ID | redrive ID|--all`: the dead letters of the relay,
//! the consumers and the sidecar, for people (a table) and scripts (`--json`).
//! A redrive publishes the stored payload to the stored destination with the
//! original key, then marks the letter redriven; the key lets the consumer
//! drop it if the message was in fact handled already.

use std::collections::HashMap;

use anyhow::{Context, bail};
use clap::{Args, Subcommand};
use comfy_table::{Table, presets::UTF8_FULL_CONDENSED};
use idem::{AnyStore, Timestamp};
use idem_broker::dead_letter::{self, DeadLetter, DeadLetterStore, RedriveError};
use idem_broker::publish::{self, Publisher};
use serde_json::{Value, json};

/// `idem dlq ...`
#[derive(Debug, Subcommand)]
pub(crate) enum DlqCommand {
    /// List dead letters, oldest first.
    Ls(LsArgs),
    /// Show one dead letter in full.
    Show(ShowArgs),
    /// Publish dead letters again, with their original keys.
    Redrive(RedriveArgs),
}

/// `idem dlq ls`
#[derive(Debug, Args)]
pub(crate) struct LsArgs {
    /// Include letters already redriven.
    #[arg(long)]
    pub all: bool,
    /// At most this many letters.
    #[arg(long, default_value_t = 100)]
    pub limit: usize,
    /// Print JSON for scripts instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// `idem dlq show`
#[derive(Debug, Args)]
pub(crate) struct ShowArgs {
    /// The letter's id (from `idem dlq ls`).
    pub id: i64,
    /// Print JSON for scripts instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// `idem dlq redrive`
#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("which").required(true).args(["id", "all"])))]
pub(crate) struct RedriveArgs {
    /// The letter to redrive.
    pub id: Option<i64>,
    /// Every letter not redriven yet.
    #[arg(long)]
    pub all: bool,
}

pub(crate) async fn run(store: AnyStore, command: DlqCommand) -> anyhow::Result<()> {
    match command {
        DlqCommand::Ls(args) => list(&store, &args).await,
        DlqCommand::Show(args) => show(&store, &args).await,
        DlqCommand::Redrive(args) => match args.id {
            Some(id) => redrive_one(&store, id).await,
            None => redrive_all(&store).await,
        },
    }
}

fn time(t: Timestamp) -> String {
    humantime::format_rfc3339_seconds(t.to_system_time()).to_string()
}

fn payload_text(payload: &[u8]) -> String {
    match std::str::from_utf8(payload) {
        Ok(text) => text.to_owned(),
        Err(_) => format!("<{} bytes of binary data>", payload.len()),
    }
}

fn shorten(text: &str, at: usize) -> String {
    if text.chars().count() > at {
        format!("{}…", text.chars().take(at - 1).collect::<String>())
    } else {
        text.to_owned()
    }
}

fn to_json(letter: &DeadLetter) -> Value {
    json!({
        "id": letter.id,
        "origin": letter.origin,
        "destination": publish::redact(&letter.destination),
        "key": letter.key.as_str(),
        "payload": payload_text(&letter.payload),
        "payload_bytes": letter.payload.len(),
        "headers": letter.headers,
        "attempts": letter.attempts,
        "last_error": letter.last_error,
        "first_seen_at_ms": letter.first_seen_at.0,
        "dead_at_ms": letter.dead_at.0,
        "redriven_at_ms": letter.redriven_at.map(|t| t.0),
    })
}

async fn list(store: &AnyStore, args: &LsArgs) -> anyhow::Result<()> {
    let letters = store
        .list_dead_letters(args.limit, args.all)
        .await
        .context("cannot list dead letters")?;
    if args.json {
        let all: Vec<Value> = letters.iter().map(to_json).collect();
        println!("{}", serde_json::to_string_pretty(&all)?);
        return Ok(());
    }
    let stats = store
        .dead_letter_stats()
        .await
        .context("cannot count dead letters")?;
    if letters.is_empty() {
        println!("no dead letters{}", if args.all { "" } else { " waiting" });
    } else {
        let mut table = Table::new();
        table.load_preset(UTF8_FULL_CONDENSED).set_header([
            "id",
            "origin",
            "key",
            "destination",
            "attempts",
            "dead at",
            "redriven",
            "last error",
        ]);
        for letter in &letters {
            table.add_row([
                letter.id.to_string(),
                letter.origin.clone(),
                letter.key.to_string(),
                publish::redact(&letter.destination),
                letter.attempts.to_string(),
                time(letter.dead_at),
                letter.redriven_at.map_or_else(|| "-".to_owned(), time),
                shorten(&letter.last_error, 60),
            ]);
        }
        println!("{table}");
    }
    let oldest = stats.oldest_waiting.map_or_else(String::new, |t| {
        format!("; the oldest waiting died at {}", time(t))
    });
    println!(
        "{} waiting, {} redriven{oldest}",
        stats.waiting, stats.redriven
    );
    if letters.len() == args.limit {
        println!("(first {} shown; use --limit for more)", args.limit);
    }
    Ok(())
}

async fn show(store: &AnyStore, args: &ShowArgs) -> anyhow::Result<()> {
    let letter = store
        .get_dead_letter(args.id)
        .await
        .context("cannot read the dead letter")?
        .with_context(|| {
            format!(
                "no dead letter with id {}; `idem dlq ls` lists them",
                args.id
            )
        })?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&to_json(&letter))?);
        return Ok(());
    }
    let mut table = Table::new();
    table.load_preset(UTF8_FULL_CONDENSED);
    let mut rows = vec![
        ("id", letter.id.to_string()),
        ("origin", letter.origin.clone()),
        ("key", letter.key.to_string()),
        ("destination", publish::redact(&letter.destination)),
        ("attempts", letter.attempts.to_string()),
        ("last error", letter.last_error.clone()),
        ("first seen", time(letter.first_seen_at)),
        ("dead at", time(letter.dead_at)),
        (
            "redriven",
            letter.redriven_at.map_or_else(|| "never".to_owned(), time),
        ),
    ];
    for (name, value) in &letter.headers {
        rows.push(("header", format!("{name}: {value}")));
    }
    rows.push(("payload", payload_text(&letter.payload)));
    for (name, value) in rows {
        table.add_row([name.to_owned(), value]);
    }
    println!("{table}");
    Ok(())
}

async fn redrive_one(store: &AnyStore, id: i64) -> anyhow::Result<()> {
    match dead_letter::redrive(store, id).await {
        Ok(letter) => {
            println!(
                "redriven {id} to {} with key {}",
                publish::redact(&letter.destination),
                letter.key
            );
            Ok(())
        }
        Err(RedriveError::NotFound(id)) => {
            bail!("no dead letter with id {id}; `idem dlq ls` lists them")
        }
        Err(error) => Err(error).context("the redrive failed; the letter stays waiting"),
    }
}

async fn redrive_all(store: &AnyStore) -> anyhow::Result<()> {
    const BATCH: usize = 100;
    let mut publishers: HashMap<String, Publisher> = HashMap::new();
    let (mut redriven, mut failed) = (0u64, 0u64);
    let mut skipped: Vec<i64> = Vec::new();
    loop {
        let letters = store
            .list_dead_letters(BATCH + skipped.len(), false)
            .await
            .context("cannot list dead letters")?;
        let todo: Vec<_> = letters
            .into_iter()
            .filter(|l| !skipped.contains(&l.id))
            .collect();
        if todo.is_empty() {
            break;
        }
        for letter in todo {
            let target = letter.destination.clone();
            if !publishers.contains_key(&target) {
                let connected = match dead_letter::destination(&letter) {
                    Ok(destination) => publish::connect(&destination).await,
                    Err(error) => {
                        eprintln!("{error}");
                        failed += 1;
                        skipped.push(letter.id);
                        continue;
                    }
                };
                match connected {
                    Ok(publisher) => {
                        publishers.insert(target.clone(), publisher);
                    }
                    Err(error) => {
                        eprintln!("dead letter {}: {error}", letter.id);
                        failed += 1;
                        skipped.push(letter.id);
                        continue;
                    }
                }
            }
            let publisher = &publishers[&target];
            match dead_letter::redrive_with(store, &letter, publisher).await {
                Ok(()) => {
                    println!(
                        "redriven {} to {} with key {}",
                        letter.id,
                        publish::redact(&letter.destination),
                        letter.key
                    );
                    redriven += 1;
                }
                Err(error) => {
                    eprintln!("{error}");
                    failed += 1;
                    skipped.push(letter.id);
                }
            }
        }
    }
    println!("{redriven} redriven, {failed} failed");
    if failed > 0 {
        bail!("{failed} dead letters could not be redriven; they stay waiting");
    }
    Ok(())
}
