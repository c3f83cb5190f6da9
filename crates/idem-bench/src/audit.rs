//! `idem bench audit`: what the effect auditor costs the database. An effect
//! log of `--rows` rows, each with its completed record, is read by a full
//! pass (without pauses, then paced by `--pause`), by a pass that finds
//! nothing new, and by a pass over `--new-rows` added rows; the baseline is
//! the same effects query read whole in one statement, in the same run.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use comfy_table::{Table, presets::UTF8_FULL_CONDENSED};
use idem::sqlx::{AssertSqlSafe, Connection, PgConnection};
use idem::{AnyStore, Scope, StoreLocation, SystemClock};
use idem_check::audit::{Audit, AuditSettings, EffectLog, PassLimits, PassReport};
use idem_check::effects::query::{self, Pages, PgPages, SqlitePages};
use idem_demo::store::given_or_temporary;

use crate::args::BenchAuditArgs;

const SCOPE: &str = "bench-audit";
const TABLE: &str = "idem_bench_audit_ledger";
const QUERY: &str = "SELECT id, order_id AS key FROM idem_bench_audit_ledger";

/// The database the effects and records are written to, apart from the store.
enum Database {
    Sqlite(idem::rusqlite::Connection),
    Postgres(PgConnection),
}

impl Database {
    async fn open(location: &StoreLocation) -> anyhow::Result<Self> {
        Ok(match location {
            StoreLocation::Sqlite(path) => {
                let conn = idem::rusqlite::Connection::open(path)?;
                conn.busy_timeout(Duration::from_secs(30))?;
                Self::Sqlite(conn)
            }
            StoreLocation::Postgres(url) => Self::Postgres(PgConnection::connect(url).await?),
            StoreLocation::Redis(_) | StoreLocation::DynamoDb(_) => anyhow::bail!(
                "idem bench audit reads effects with SQL: give a sqlite:// or postgres:// --store"
            ),
        })
    }

    async fn execute(&mut self, sql: &str) -> anyhow::Result<()> {
        match self {
            Self::Sqlite(conn) => conn.execute_batch(sql)?,
            Self::Postgres(conn) => {
                idem::sqlx::raw_sql(AssertSqlSafe(sql.to_owned()))
                    .execute(conn)
                    .await?;
            }
        }
        Ok(())
    }

    /// `count` completed records, and one ledger row for each, in key order
    /// of their first claim.
    async fn fill(&mut self, tag: &str, from: u64, count: u64) -> anyhow::Result<()> {
        let seed = idem::protocol::RecordSeed {
            scope: Scope::new(SCOPE)?,
            tag: tag.to_owned(),
            from: i64::try_from(from)?,
            count: i64::try_from(count)?,
            now: idem::Clock::now(&SystemClock),
            window: idem::DEFAULT_RETENTION,
        };
        match self {
            Self::Sqlite(conn) => idem::SqliteStore::seed_records(conn, &seed)?,
            Self::Postgres(conn) => idem::PgStore::seed_records(conn, &seed).await?,
        }
        self.execute(&format!(
            "INSERT INTO {TABLE} (order_id) SELECT key FROM idem_records \
             WHERE scope = '{SCOPE}' AND key LIKE '{tag}-%' ORDER BY created_at, key"
        ))
        .await?;
        self.execute(&format!("ANALYZE {TABLE}")).await
    }
}

/// The effect log on the store's database.
enum Log {
    Sqlite(SqlitePages),
    Postgres(PgPages),
}

impl EffectLog for Log {
    async fn page(
        &mut self,
        after: i64,
        limit: usize,
    ) -> Result<Vec<idem_check::LoggedEffect>, query::QueryError> {
        match self {
            Self::Sqlite(pages) => pages.page(after, limit).await,
            Self::Postgres(pages) => pages.page(after, limit).await,
        }
    }
}

async fn open_log(location: &StoreLocation) -> anyhow::Result<Log> {
    let pages = Pages::new(QUERY, "id")?;
    Ok(match location {
        StoreLocation::Sqlite(path) => Log::Sqlite(SqlitePages::open(path, pages)?),
        StoreLocation::Postgres(url) => {
            Log::Postgres(PgPages::connect(url, &location.to_string(), pages).await?)
        }
        StoreLocation::Redis(_) | StoreLocation::DynamoDb(_) => {
            unreachable!("refused when the database was opened")
        }
    })
}

/// The effects query read whole, once: the baseline.
async fn read_whole(location: &StoreLocation) -> anyhow::Result<(usize, Duration)> {
    let sql = format!("{QUERY} ORDER BY id");
    let started = Instant::now();
    let rows = match location {
        StoreLocation::Sqlite(path) => {
            let path: &Path = path;
            query::sqlite(path, &sql)?
        }
        StoreLocation::Postgres(url) => query::postgres(url, &location.to_string(), &sql).await?,
        StoreLocation::Redis(_) | StoreLocation::DynamoDb(_) => {
            unreachable!("refused when the database was opened")
        }
    };
    Ok((rows.len(), started.elapsed()))
}

/// One measured pass.
struct Measured {
    name: String,
    report: PassReport,
    elapsed: Duration,
}

async fn measure<L: EffectLog, S: idem::RecordScan>(
    audit: &mut Audit<L, S>,
    name: String,
) -> anyhow::Result<Measured> {
    let started = Instant::now();
    let report = audit.pass().await.context("the audit pass failed")?;
    let elapsed = started.elapsed();
    anyhow::ensure!(
        report.findings.is_empty(),
        "the audit found {} findings in a correct log: {}",
        report.findings.len(),
        report.findings[0]
    );
    Ok(Measured {
        name,
        report,
        elapsed,
    })
}

pub(crate) async fn run(
    location: Option<StoreLocation>,
    args: &BenchAuditArgs,
) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.rows > 0 && args.batch > 0,
        "--rows and --batch must be positive"
    );
    let (_temporary, location) = given_or_temporary(location)?;
    let store = AnyStore::open(&location)
        .await
        .with_context(|| format!("cannot open the store at {location}"))?;
    let mut database = Database::open(&location).await?;
    let id = match database {
        Database::Sqlite(_) => "INTEGER PRIMARY KEY",
        Database::Postgres(_) => "BIGSERIAL PRIMARY KEY",
    };
    database
        .execute(&format!(
            "DROP TABLE IF EXISTS {TABLE}; CREATE TABLE {TABLE} (id {id}, order_id TEXT NOT NULL); \
             DELETE FROM idem_records WHERE scope = '{SCOPE}'"
        ))
        .await?;
    let run: u32 = rand::random();
    let tag = format!("{run:08x}");
    let started = Instant::now();
    database.fill(&tag, 0, args.rows).await?;
    println!(
        "store {location}; {} effect rows with their completed records written in {:.1} s; batch {}, pause {}",
        args.rows,
        started.elapsed().as_secs_f64(),
        args.batch,
        humantime::format_duration(args.pause)
    );

    let (whole, whole_time) = read_whole(&location).await?;
    let settings = AuditSettings {
        scopes: vec![Scope::new(SCOPE)?],
        window: idem::DEFAULT_RETENTION,
        grace: Duration::from_secs(30),
    };
    let audit = |pause: Duration| {
        let (store, settings) = (store.clone(), settings.clone());
        let location = location.clone();
        async move {
            let limits = PassLimits {
                batch: args.batch,
                pause,
            };
            anyhow::Ok(Audit::new(
                open_log(&location).await?,
                store,
                Arc::new(SystemClock),
                settings,
                limits,
                i64::MIN,
            ))
        }
    };
    let mut passes = Vec::new();
    let mut unpaced = audit(Duration::ZERO).await?;
    passes.push(measure(&mut unpaced, "full pass, no pause".to_owned()).await?);
    let mut paced = audit(args.pause).await?;
    let paced_name = format!(
        "full pass, {} pause",
        humantime::format_duration(args.pause)
    );
    passes.push(measure(&mut paced, paced_name).await?);
    passes.push(measure(&mut paced, "next pass, nothing new".to_owned()).await?);
    database
        .fill(&format!("{tag}-new"), args.rows, args.new_rows)
        .await?;
    passes.push(measure(&mut paced, format!("next pass, {} new rows", args.new_rows)).await?);

    let base = whole as f64 / whole_time.as_secs_f64();
    let mut table = Table::new();
    table.load_preset(UTF8_FULL_CONDENSED).set_header([
        "phase",
        "effect rows",
        "records",
        "queries",
        "seconds",
        "rows/s",
        "vs whole query",
    ]);
    table.add_row([
        "effects query read whole (baseline)".to_owned(),
        whole.to_string(),
        "0".to_owned(),
        "1".to_owned(),
        format!("{:.3}", whole_time.as_secs_f64()),
        format!("{base:.0}"),
        "1.00".to_owned(),
    ]);
    for pass in &passes {
        let rate = pass.report.rows_read as f64 / pass.elapsed.as_secs_f64();
        table.add_row([
            pass.name.clone(),
            pass.report.rows_read.to_string(),
            pass.report.records_read.to_string(),
            pass.report.queries.to_string(),
            format!("{:.3}", pass.elapsed.as_secs_f64()),
            format!("{rate:.0}"),
            format!("{:.2}", rate / base),
        ]);
    }
    println!("{table}");
    println!(
        "the auditor remembers {} keys (their first effect in the window); no findings in a correct log",
        paced.auditor().remembered()
    );
    database
        .execute(&format!(
            "DROP TABLE IF EXISTS {TABLE}; DELETE FROM idem_records WHERE scope = '{SCOPE}'"
        ))
        .await?;
    Ok(())
}
