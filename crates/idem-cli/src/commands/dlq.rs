//! `idem dlq ls | groups | show ID | redrive ID|--all|--group CAUSE |
//! discard ID|--group CAUSE | archive ID|--group CAUSE`: the dead
//! letters of the relay, the consumers and the sidecar, for people (a table)
//! and scripts (`--json`). A redrive publishes the stored payload to the
//! stored destination with the original key, then marks the letter redriven;
//! the key lets the consumer drop it if the message was in fact handled
//! already. `groups` sorts the letters by cause (the first line of their last
//! error), so a whole failure can be redriven once its cause is fixed.
//! `discard` deletes letters and `archive` sets them aside (kept, no longer
//! waiting); both ask first and log each letter, as it was, in the store's
//! audit log.

use std::collections::{BTreeSet, HashMap, HashSet};

use anyhow::{Context, bail};
use clap::{Args, Subcommand};
use comfy_table::{Table, presets::UTF8_FULL_CONDENSED};
use idem::{AdminStore, AnyStore, LetterAction, Timestamp};
use idem_broker::dead_letter::{
    self, CauseGroup, DeadLetter, DeadLetterStore, RedriveError, cause, group_by_cause,
};
use idem_broker::publish::{self, Publisher};
use idem_console::view::{GroupView, LetterView, WHOLE_BODY};

use super::args::ConfirmArgs;

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
    /// Delete dead letters for good (each logged in the audit log).
    Discard(SetAsideArgs),
    /// Set dead letters aside: kept, but no longer waiting, counted or
    /// listed (`idem dlq ls --all` shows them); each logged in the audit log.
    Archive(SetAsideArgs),
}

/// `idem dlq discard` and `idem dlq archive`
#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("which").required(true).args(["id", "group"])))]
pub(crate) struct SetAsideArgs {
    /// The letter (from `idem dlq ls`).
    pub id: Option<i64>,
    /// The waiting letters of one cause, as `idem dlq groups` shows it (or
    /// the start of it, if only one cause starts so).
    #[arg(long, value_name = "CAUSE")]
    pub group: Option<String>,
    #[command(flatten)]
    pub confirm: ConfirmArgs,
}

/// `idem dlq ls`
#[derive(Debug, Args)]
pub(crate) struct LsArgs {
    /// Include letters already redriven, and archived ones.
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
    /// Include letters already redriven, and archived ones.
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
        DlqCommand::Discard(args) => set_aside(&store, &args, SetAside::Discard).await,
        DlqCommand::Archive(args) => set_aside(&store, &args, SetAside::Archive).await,
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

/// The letter as scripts get it: the console's view, its payload whole.
fn to_json(letter: &DeadLetter) -> LetterView {
    LetterView::of(letter, WHOLE_BODY)
}

async fn list(store: &AnyStore, args: &LsArgs) -> anyhow::Result<()> {
    let letters = store
        .list_dead_letters(args.limit, args.all)
        .await
        .context("cannot list dead letters")?;
    if args.json {
        let all: Vec<LetterView> = letters.iter().map(to_json).collect();
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
            "archived",
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
                letter.archived_at.map_or_else(|| "-".to_owned(), time),
                shorten(&letter.last_error, 60),
            ]);
        }
        println!("{table}");
    }
    let oldest = stats.oldest_waiting.map_or_else(String::new, |t| {
        format!("; the oldest waiting died at {}", time(t))
    });
    println!(
        "{} waiting, {} redriven, {} archived{oldest}",
        stats.waiting, stats.redriven, stats.archived
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
        (
            "archived",
            letter.archived_at.map_or_else(|| "no".to_owned(), time),
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

async fn groups(store: &AnyStore, args: &GroupsArgs) -> anyhow::Result<()> {
    let letters = store
        .list_dead_letters(args.limit, args.all)
        .await
        .context("cannot list dead letters")?;
    let groups = group_by_cause(&letters);
    if args.json {
        let all: Vec<GroupView> = groups.iter().map(GroupView::from).collect();
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
    for group in &groups {
        table.add_row([
            shorten(&group.cause, 80),
            group.letters.to_string(),
            group.waiting.to_string(),
            group.origins.iter().cloned().collect::<Vec<_>>().join(", "),
            time(group.oldest),
            time(group.newest),
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
    let chosen = choose_group(&letters, given, "redrive")?;
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

/// The cause of the waiting `letters` that `given` names: the whole cause,
/// or the start of exactly one; `verb` says what the operator is about to do.
fn choose_group(letters: &[DeadLetter], given: &str, verb: &str) -> anyhow::Result<String> {
    let groups = group_by_cause(letters);
    Ok(match groups.iter().find(|group| group.cause == given) {
        Some(group) => group.cause.clone(),
        None => {
            let starting: Vec<&String> = groups
                .iter()
                .map(|group: &CauseGroup| &group.cause)
                .filter(|cause| cause.starts_with(given))
                .collect();
            match starting.as_slice() {
                [only] => (*only).clone(),
                [] => bail!(
                    "no waiting dead letter's cause is or starts with {given:?}; `idem dlq groups` lists the causes"
                ),
                several => bail!(
                    "{} causes start with {given:?}; give more of the one to {verb}:\n{}",
                    several.len(),
                    several
                        .iter()
                        .map(|c| format!("  {c}"))
                        .collect::<Vec<_>>()
                        .join("\n")
                ),
            }
        }
    })
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

/// What `idem dlq discard` and `idem dlq archive` do to a letter.
#[derive(Debug, Clone, Copy)]
enum SetAside {
    Discard,
    Archive,
}

impl SetAside {
    fn verb(self) -> &'static str {
        match self {
            Self::Discard => "discard",
            Self::Archive => "archive",
        }
    }

    fn done(self) -> &'static str {
        match self {
            Self::Discard => "discarded",
            Self::Archive => "archived",
        }
    }

    /// What it does, for the question.
    fn effect(self) -> &'static str {
        match self {
            Self::Discard => "deleted for good, never to be redriven",
            Self::Archive => {
                "kept, but no longer waiting, counted or listed (`idem dlq ls --all` shows them)"
            }
        }
    }
}

/// Discards or archives one letter, or the waiting letters of one cause,
/// once confirmed; each is logged in the audit log.
async fn set_aside(store: &AnyStore, args: &SetAsideArgs, what: SetAside) -> anyhow::Result<()> {
    let actor = super::confirm::actor(&args.confirm)?;
    let chosen: Vec<DeadLetter> = match (args.id, &args.group) {
        (Some(id), _) => vec![
            store
                .get_dead_letter(id)
                .await
                .context("cannot read the dead letter")?
                .with_context(|| {
                    format!("no dead letter with id {id}; `idem dlq ls` lists them")
                })?,
        ],
        (None, Some(given)) => {
            let given = given.trim();
            if given.is_empty() {
                bail!("--group needs a cause, as `idem dlq groups` shows it");
            }
            let letters = store
                .list_dead_letters(usize::MAX >> 1, false)
                .await
                .context("cannot list dead letters")?;
            let cause_of = choose_group(&letters, given, what.verb())?;
            letters
                .into_iter()
                .filter(|l| cause(l) == cause_of)
                .collect()
        }
        (None, None) => bail!("name a letter by its id, or a cause with --group"),
    };
    if let (SetAside::Archive, [letter]) = (what, chosen.as_slice())
        && let Some(at) = letter.archived_at
    {
        bail!(
            "dead letter {} was archived already, at {}; nothing changed",
            letter.id,
            time(at)
        );
    }
    let mut table = Table::new();
    table.load_preset(UTF8_FULL_CONDENSED).set_header([
        "id",
        "origin",
        "key",
        "dead at",
        "last error",
    ]);
    for letter in &chosen {
        table.add_row([
            letter.id.to_string(),
            letter.origin.clone(),
            letter.key.to_string(),
            time(letter.dead_at),
            shorten(cause(letter), 60),
        ]);
    }
    println!("{table}");
    if !args.confirm.yes {
        println!(
            "would {} {} dead letter{}: {}",
            what.verb(),
            chosen.len(),
            if chosen.len() == 1 { "" } else { "s" },
            what.effect()
        );
    }
    super::confirm::confirm(&args.confirm, &format!("{} them", what.verb()))?;
    let (mut done, mut skipped) = (0u64, 0u64);
    for letter in &chosen {
        let answer = match what {
            SetAside::Discard => store.discard_dead_letter(letter.id, &actor).await,
            SetAside::Archive => store.archive_dead_letter(letter.id, &actor).await,
        }
        .with_context(|| format!("cannot {} dead letter {}", what.verb(), letter.id))?;
        match answer {
            LetterAction::Done(entry) => {
                println!(
                    "{} dead letter {} (key {}); audit entry {} by {}",
                    what.done(),
                    letter.id,
                    letter.key,
                    entry.id,
                    entry.actor
                );
                done += 1;
            }
            LetterAction::Missing => {
                println!("dead letter {} is gone already", letter.id);
                skipped += 1;
            }
            LetterAction::AlreadyArchived(at) => {
                println!(
                    "dead letter {} was archived already, at {}",
                    letter.id,
                    time(at)
                );
                skipped += 1;
            }
        }
    }
    println!("{done} {}, {skipped} left as they were", what.done());
    Ok(())
}
