//! `idem dlq ls | groups | show ID | redrive ID|--all|--group CAUSE`: the dead
//! letters of the relay, the consumers and the sidecar, for people (a table)
//! and scripts (`--json`). A redrive publishes the stored payload to the
//! stored destination with the original key, then marks the letter redriven;
//! the key lets the consumer drop it if the message was in fact handled
//! already. `groups` sorts the letters by cause (the first line of their last
//! error), so a whole failure can be redriven once its cause is fixed.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

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
    /// Dead letters by cause (the first line of their last error), with
    /// counts, origins, and the oldest and newest of each.
    Groups(GroupsArgs),
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

/// `idem dlq groups`
#[derive(Debug, Args)]
pub(crate) struct GroupsArgs {
    /// Include letters already redriven.
    #[arg(long)]
    pub all: bool,
    /// At most this many letters are read, oldest first.
    #[arg(long, default_value_t = 100_000)]
    pub limit: usize,
    /// Print JSON for scripts instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// `idem dlq redrive`
#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("which").required(true).args(["id", "all", "group"])))]
pub(crate) struct RedriveArgs {
    /// The letter to redrive.
    pub id: Option<i64>,
    /// Every letter not redriven yet.
    #[arg(long)]
    pub all: bool,
    /// The waiting letters of one cause, as `idem dlq groups` shows it (or
    /// the start of it, if only one cause starts so); needs --yes.
    #[arg(long, value_name = "CAUSE")]
    pub group: Option<String>,
    /// Redrive the group; without it, only say what would be redriven.
    #[arg(long)]
    pub yes: bool,
}

pub(crate) async fn run(store: AnyStore, command: DlqCommand) -> anyhow::Result<()> {
    match command {
        DlqCommand::Ls(args) => list(&store, &args).await,
        DlqCommand::Groups(args) => groups(&store, &args).await,
        DlqCommand::Show(args) => show(&store, &args).await,
        DlqCommand::Redrive(args) => match (args.id, &args.group) {
            (Some(id), _) => redrive_one(&store, id).await,
            (None, Some(cause)) => redrive_group(&store, cause, args.yes).await,
            (None, None) => redrive_where(&store, |_| true).await,
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

/// What a letter died of: the first line of its last error.
fn cause(letter: &DeadLetter) -> &str {
    match letter.last_error.lines().next().map(str::trim) {
        Some(line) if !line.is_empty() => line,
        _ => "(no error text)",
    }
}

/// The letters of one cause.
#[derive(Debug, Default)]
struct Group {
    letters: u64,
    waiting: u64,
    origins: BTreeSet<String>,
    oldest: Option<Timestamp>,
    newest: Option<Timestamp>,
}

/// The letters by cause, the largest group first.
fn group_by_cause(letters: &[DeadLetter]) -> Vec<(String, Group)> {
    let mut groups: BTreeMap<String, Group> = BTreeMap::new();
    for letter in letters {
        let group = groups.entry(cause(letter).to_owned()).or_default();
        group.letters += 1;
        group.waiting += u64::from(letter.redriven_at.is_none());
        group.origins.insert(letter.origin.clone());
        group.oldest = Some(
            group
                .oldest
                .map_or(letter.dead_at, |t| t.min(letter.dead_at)),
        );
        group.newest = Some(
            group
                .newest
                .map_or(letter.dead_at, |t| t.max(letter.dead_at)),
        );
    }
    let mut groups: Vec<_> = groups.into_iter().collect();
    groups.sort_by(|a, b| b.1.letters.cmp(&a.1.letters).then_with(|| a.0.cmp(&b.0)));
    groups
}

async fn groups(store: &AnyStore, args: &GroupsArgs) -> anyhow::Result<()> {
    let letters = store
        .list_dead_letters(args.limit, args.all)
        .await
        .context("cannot list dead letters")?;
    let groups = group_by_cause(&letters);
    if args.json {
        let all: Vec<Value> = groups
            .iter()
            .map(|(cause, group)| {
                json!({
                    "cause": cause,
                    "letters": group.letters,
                    "waiting": group.waiting,
                    "origins": group.origins,
                    "oldest_dead_at_ms": group.oldest.map(|t| t.0),
                    "newest_dead_at_ms": group.newest.map(|t| t.0),
                })
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&all)?);
        return Ok(());
    }
    if groups.is_empty() {
        println!("no dead letters{}", if args.all { "" } else { " waiting" });
        return Ok(());
    }
    let mut table = Table::new();
    table
        .load_preset(UTF8_FULL_CONDENSED)
        .set_header(["cause", "letters", "waiting", "origins", "oldest", "newest"]);
    for (cause, group) in &groups {
        table.add_row([
            shorten(cause, 80),
            group.letters.to_string(),
            group.waiting.to_string(),
            group.origins.iter().cloned().collect::<Vec<_>>().join(", "),
            group.oldest.map_or_else(String::new, time),
            group.newest.map_or_else(String::new, time),
        ]);
    }
    println!("{table}");
    println!(
        "{} letters in {} groups; redrive one with: idem dlq redrive --group 'CAUSE' --yes",
        letters.len(),
        groups.len()
    );
    if letters.len() == args.limit {
        println!("(first {} letters read; use --limit for more)", args.limit);
    }
    Ok(())
}

/// Redrives the waiting letters of the one cause `given` names (the whole
/// cause, or the start of exactly one); with `yes` unset, only says what
/// would be redriven.
async fn redrive_group(store: &AnyStore, given: &str, yes: bool) -> anyhow::Result<()> {
    let given = given.trim();
    if given.is_empty() {
        bail!("--group needs a cause, as `idem dlq groups` shows it");
    }
    let letters = store
        .list_dead_letters(usize::MAX >> 1, false)
        .await
        .context("cannot list dead letters")?;
    let groups = group_by_cause(&letters);
    let chosen = match groups.iter().find(|(cause, _)| cause == given) {
        Some((cause, _)) => cause.clone(),
        None => {
            let starting: Vec<&String> = groups
                .iter()
                .map(|(cause, _)| cause)
                .filter(|cause| cause.starts_with(given))
                .collect();
            match starting.as_slice() {
                [only] => (*only).clone(),
                [] => bail!(
                    "no waiting dead letter's cause is or starts with {given:?}; `idem dlq groups` lists the causes"
                ),
                several => bail!(
                    "{} causes start with {given:?}; give more of the one to redrive:\n{}",
                    several.len(),
                    several
                        .iter()
                        .map(|c| format!("  {c}"))
                        .collect::<Vec<_>>()
                        .join("\n")
                ),
            }
        }
    };
    let members: HashSet<i64> = letters
        .iter()
        .filter(|l| cause(l) == chosen)
        .map(|l| l.id)
        .collect();
    if !yes {
        let destinations: BTreeSet<String> = letters
            .iter()
            .filter(|l| members.contains(&l.id))
            .map(|l| publish::redact(&l.destination))
            .collect();
        println!(
            "would redrive {} waiting letters of cause {chosen:?}, each to its stored destination with its original key: {}",
            members.len(),
            destinations.into_iter().collect::<Vec<_>>().join(", ")
        );
        bail!("nothing redriven: run again with --yes to redrive them");
    }
    redrive_where(store, |letter| members.contains(&letter.id)).await
}

/// Redrives every waiting letter `chosen` picks, in batches, one publisher
/// per destination.
async fn redrive_where(
    store: &AnyStore,
    chosen: impl Fn(&DeadLetter) -> bool,
) -> anyhow::Result<()> {
    const BATCH: usize = 100;
    let mut publishers: HashMap<String, Publisher> = HashMap::new();
    let (mut redriven, mut failed) = (0u64, 0u64);
    // Letters left waiting: not chosen, or failed this time.
    let mut passed: HashSet<i64> = HashSet::new();
    loop {
        let window = BATCH + passed.len();
        let letters = store
            .list_dead_letters(window, false)
            .await
            .context("cannot list dead letters")?;
        let seen_all = letters.len() < window;
        let mut todo = Vec::new();
        for letter in letters {
            if passed.contains(&letter.id) {
                continue;
            }
            if chosen(&letter) {
                todo.push(letter);
            } else {
                passed.insert(letter.id);
            }
        }
        if todo.is_empty() {
            if seen_all {
                break;
            }
            // The window held only letters passed over: the next one is wider.
            continue;
        }
        for letter in todo {
            let target = letter.destination.clone();
            if !publishers.contains_key(&target) {
                let connected = match dead_letter::destination(&letter) {
                    Ok(destination) => publish::connect(&destination).await,
                    Err(error) => {
                        eprintln!("{error}");
                        failed += 1;
                        passed.insert(letter.id);
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
                        passed.insert(letter.id);
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
                    passed.insert(letter.id);
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
