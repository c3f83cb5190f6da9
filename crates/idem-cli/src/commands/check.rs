//! `idem check`: a history against the effect log it caused. Exits 0 when
//! the history is clean, 1 when it has violations, 2 when the input cannot
//! be read (see [`BadInput`]).

use std::fmt;
use std::fs::File;
use std::io::{self, BufRead, BufReader};
use std::path::Path;

use anyhow::{Context, anyhow};
use clap::{ArgGroup, Args};
use idem::StoreLocation;
use idem_check::{Effect, Event, effects, history};

/// `idem check`
#[derive(Debug, Args)]
#[command(group(
    ArgGroup::new("effect_log")
        .required(true)
        .args(["effects", "effects_query"])
))]
pub(crate) struct CheckArgs {
    /// The history: JSON Lines, one invoke, ok, fail or unknown event per
    /// line, in the order they happened; `-` reads it from standard input.
    #[arg(value_name = "HISTORY")]
    pub history: String,
    /// The effect log as a file: JSON Lines, one {"key", "scope",
    /// "resource", "fence"} object per effect, in commit order.
    #[arg(long, value_name = "FILE")]
    pub effects: Option<String>,
    /// The effect log as a SQL query run on --store: it returns a column
    /// `key`, optionally `scope`, `resource` and `fence` (an integer), one row
    /// per effect in commit order (end it with ORDER BY).
    #[arg(long, value_name = "SQL")]
    pub effects_query: Option<String>,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

/// Input `idem check` could not read: a missing file, a malformed line, an
/// unreachable store. The command exits 2 for it, apart from the 1 of a
/// history with violations.
#[derive(Debug)]
pub(crate) struct BadInput(anyhow::Error);

impl fmt::Display for BadInput {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&super::error_text(&self.0))
    }
}

impl std::error::Error for BadInput {}

fn bad_input(error: anyhow::Error) -> anyhow::Error {
    anyhow::Error::new(BadInput(error))
}

pub(crate) async fn run(store: Option<&str>, args: &CheckArgs) -> anyhow::Result<()> {
    let (history, effects) = read_input(store, args).await.map_err(bad_input)?;
    let report = idem_check::check(&history, &effects);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{report}");
    }
    match report.violations.len() {
        0 => Ok(()),
        1 => Err(anyhow!("1 violation found")),
        n => Err(anyhow!("{n} violations found")),
    }
}

async fn read_input(
    store: Option<&str>,
    args: &CheckArgs,
) -> anyhow::Result<(Vec<Event>, Vec<Effect>)> {
    let history = history::read(open(&args.history, "history")?)?;
    history::validate(&history)?;
    let effects = match (&args.effects, &args.effects_query) {
        (Some(file), _) => effects::read(open(file, "effect log")?)?,
        (None, Some(sql)) => query(store, sql).await?,
        (None, None) => unreachable!("clap requires one of --effects and --effects-query"),
    };
    Ok((history, effects))
}

fn open(path: &str, what: &str) -> anyhow::Result<Box<dyn BufRead>> {
    if path == "-" {
        return Ok(Box::new(BufReader::new(io::stdin())));
    }
    let file =
        File::open(Path::new(path)).with_context(|| format!("cannot open the {what} {path}"))?;
    Ok(Box::new(BufReader::new(file)))
}

async fn query(store: Option<&str>, sql: &str) -> anyhow::Result<Vec<Effect>> {
    let store = store
        .context("--effects-query needs --store (or IDEM_STORE): the database the query runs on")?;
    let location: StoreLocation = store.parse().context("invalid --store (or IDEM_STORE)")?;
    let effects = match &location {
        StoreLocation::Sqlite(path) => {
            let (path, sql) = (path.clone(), sql.to_owned());
            tokio::task::spawn_blocking(move || effects::query::sqlite(&path, &sql)).await?
        }
        StoreLocation::Postgres(url) => {
            effects::query::postgres(url, &location.to_string(), sql).await
        }
        StoreLocation::DynamoDb(_) => anyhow::bail!(
            "--effects-query runs SQL on the store's database, and {location} is a DynamoDB table: point --store at the SQLite or PostgreSQL database the effects were written to"
        ),
        StoreLocation::Redis(_) => anyhow::bail!(
            "--effects-query runs SQL on the store's database, and {location} is a Redis store, which holds records only: point --store at the SQLite or PostgreSQL database the effects were written to"
        ),
    };
    Ok(effects?)
}
