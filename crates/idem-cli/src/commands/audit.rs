//! `idem audit`: the live auditor of double effects. Beside a running
//! service it reads the service's effect log (the same query `idem check
//! --effects-query` takes, plus a cursor column) in bounded batches, reads
//! the store's records of the audited scopes, and reports each double
//! effect, missing effect and effect without a record once, as a log line
//! or a JSON line, with a counter per kind on `/metrics`.
//!
//! `--once` runs a single pass and exits 0 when it found nothing, 1 when it
//! found something (for cron and tests).

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, anyhow};
use clap::Args;
use idem::{AnyStore, Scope, StoreLocation, SystemClock};
use idem_check::audit::{
    Audit, AuditSettings, EffectLog, Finding, FindingKind, PassLimits, PassReport, SqlLog,
};
use idem_check::effects::query::{Pages, PgPages, SqlitePages};
use idem_gateway::admin;

use super::upkeep::AdminArgs;

/// `idem audit`
#[derive(Debug, Args)]
pub(crate) struct AuditArgs {
    /// The effect log as a SQL query run on --store, as for `idem check
    /// --effects-query`: a column `key`, optionally `scope`, `resource`,
    /// `fence` and `at_ms` (when the effect was written, in milliseconds
    /// since the Unix epoch), and the cursor column. No ORDER BY or LIMIT
    /// needed: rows are read in cursor order, a batch at a time.
    #[arg(long, value_name = "SQL")]
    pub effects_query: String,
    /// The integer column of the query that grows with every row (an id, a
    /// sequence); each pass reads the rows past the last one it read.
    #[arg(long, value_name = "COLUMN", default_value = "id")]
    pub cursor_column: String,
    /// A scope whose records are compared with the effects (repeat for
    /// several). Effects without a `scope` column are in this scope when
    /// only one is given.
    #[arg(long = "scope", value_name = "SCOPE", required = true)]
    pub scopes: Vec<String>,
    /// Start after this cursor value instead of at the beginning of the
    /// log; records claimed before the auditor started are then not
    /// checked for their effect.
    #[arg(long, value_name = "CURSOR", allow_hyphen_values = true)]
    pub after: Option<i64>,
    /// Rows per query (effects or records).
    #[arg(long, default_value_t = 1000)]
    pub batch: usize,
    /// The wait between two queries of a pass, such as 100ms: with --batch,
    /// the most the auditor asks of the database.
    #[arg(long, value_name = "DURATION", default_value = "100ms")]
    pub pause: humantime::Duration,
    /// The wait between two passes.
    #[arg(long, value_name = "DURATION", default_value = "10s")]
    pub interval: humantime::Duration,
    /// How long after a record completed its effect may still be missing
    /// from the log before it is reported.
    #[arg(long, value_name = "DURATION", default_value = "30s")]
    pub grace: humantime::Duration,
    /// The dedupe window: two effects of one key less than this apart are a
    /// double effect. Set it to the services' retention.
    #[arg(long, value_name = "DURATION", default_value = "7d")]
    pub window: humantime::Duration,
    /// Run one pass, print what it found, and exit: 0 when nothing was
    /// found, 1 otherwise.
    #[arg(long)]
    pub once: bool,
    /// Write each finding as one JSON object per line.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub admin: AdminArgs,
}

/// The effect log on the store's own database: `query` read in pages by
/// `cursor_column`.
pub(super) async fn open_log(
    location: &StoreLocation,
    query: &str,
    cursor_column: &str,
) -> anyhow::Result<SqlLog> {
    let pages = Pages::new(query, cursor_column).context("the cursor column")?;
    Ok(match location {
        StoreLocation::Sqlite(path) => {
            let path = path.clone();
            let pages =
                tokio::task::spawn_blocking(move || SqlitePages::open(&path, pages)).await??;
            SqlLog::Sqlite(pages)
        }
        StoreLocation::Postgres(url) => {
            SqlLog::Postgres(PgPages::connect(url, &location.to_string(), pages).await?)
        }
        StoreLocation::Redis(_) => anyhow::bail!(
            "the auditor reads the effects with SQL on the store's database, and {location} is a Redis store, which holds records only: point --store at the SQLite or PostgreSQL database the service writes its effects and records to"
        ),
        StoreLocation::DynamoDb(_) => anyhow::bail!(
            "the auditor reads the effects with SQL on the store's database, and {location} is a DynamoDB table: point --store at the SQLite or PostgreSQL database the service writes its effects and records to"
        ),
    })
}

/// The metrics `idem audit` exposes on `--admin-listen`.
mod metric {
    /// Findings, by `kind`: double_effect, missing_effect, effect_without_record.
    pub(super) const FINDINGS: &str = "audit_findings_total";
    /// Effect rows read.
    pub(super) const ROWS_READ: &str = "audit_rows_read_total";
    /// Records read.
    pub(super) const RECORDS_READ: &str = "audit_records_read_total";
    /// Queries run on the database.
    pub(super) const QUERIES: &str = "audit_queries_total";
    /// Passes completed.
    pub(super) const PASSES: &str = "audit_passes_total";
    /// Passes that failed (the database did not answer, the query failed).
    pub(super) const ERRORS: &str = "audit_errors_total";
    /// The last cursor value read.
    pub(super) const CURSOR: &str = "audit_cursor";
    /// When a pass last read the effect log to its end (Unix seconds).
    pub(super) const CAUGHT_UP: &str = "audit_caught_up_timestamp_seconds";
    /// Keys remembered with their first effect in the window.
    pub(super) const REMEMBERED: &str = "audit_remembered_keys";
}

/// The auditor's settings from its options; `flag` is how the options are
/// spelt (`--` for `idem audit`, `--audit-` for `idem console`).
pub(super) fn settings(
    flag: &str,
    scopes: &[String],
    window: Duration,
    grace: Duration,
) -> anyhow::Result<AuditSettings> {
    let scopes = scopes
        .iter()
        .map(|s| Scope::new(s.clone()).with_context(|| format!("{flag}scope {s:?}")))
        .collect::<anyhow::Result<Vec<_>>>()?;
    anyhow::ensure!(
        !window.is_zero(),
        "{flag}window 0 would never see two effects of one key as a double effect; give the dedupe window, such as 7d"
    );
    Ok(AuditSettings {
        scopes,
        window,
        grace,
    })
}

pub(crate) async fn run(
    store: AnyStore,
    location: &StoreLocation,
    args: &AuditArgs,
) -> anyhow::Result<()> {
    let settings = settings("--", &args.scopes, args.window.into(), args.grace.into())?;
    let log = open_log(location, &args.effects_query, &args.cursor_column)
        .await
        .context("cannot read the effect log (--effects-query, --cursor-column)")?;
    let admin = match args.admin.admin_listen {
        Some(addr) => {
            let (token, hosts) = args.admin.access()?;
            let server = admin::start_admin_with_hosts(
                addr,
                store.clone(),
                token,
                Default::default(),
                hosts,
            )
            .await
            .context("--admin-listen")?;
            eprintln!("metrics on http://{}/metrics", server.local_addr());
            Some(server)
        }
        None => None,
    };
    // Every series from the start, so the first finding is an increase.
    for kind in FindingKind::ALL {
        metrics::counter!(metric::FINDINGS, "kind" => kind.as_str()).increment(0);
    }
    metrics::counter!(metric::ERRORS).increment(0);
    let limits = PassLimits {
        batch: args.batch.max(1),
        pause: args.pause.into(),
    };
    let clock = Arc::new(SystemClock);
    let mut audit = Audit::new(
        log,
        store,
        clock,
        settings,
        limits,
        args.after.unwrap_or(i64::MIN),
    );
    if args.after.is_some() {
        audit
            .skip_records_before(idem::Clock::now(&SystemClock))
            .await
            .context("cannot read the store's records")?;
    }
    let outcome = match args.once {
        true => once(&mut audit, args).await,
        false => continuously(&mut audit, args).await,
    };
    if let Some(admin) = admin {
        admin.stop().await;
    }
    outcome
}

async fn once<L: EffectLog, S: idem::RecordScan>(
    audit: &mut Audit<L, S>,
    args: &AuditArgs,
) -> anyhow::Result<()> {
    let report = audit.pass().await.context("the audit pass failed")?;
    publish(&report, audit.auditor().remembered(), args);
    match report.findings.len() {
        0 => Ok(()),
        1 => Err(anyhow!("1 finding")),
        n => Err(anyhow!("{n} findings")),
    }
}

async fn continuously<L: EffectLog, S: idem::RecordScan>(
    audit: &mut Audit<L, S>,
    args: &AuditArgs,
) -> anyhow::Result<()> {
    eprintln!(
        "auditing the effect log every {} in batches of {} ({} apart); Ctrl-C stops",
        args.interval, args.batch, args.pause
    );
    audit
        .run_every(
            args.interval.into(),
            super::signals::terminated(),
            |pass, auditor| match pass {
                Ok(report) => publish(&report, auditor.remembered(), args),
                Err(error) => {
                    metrics::counter!(metric::ERRORS).increment(1);
                    tracing::warn!(error = %idem::error_chain(&error), "the audit pass failed; trying again at the next one");
                }
            },
        )
        .await;
    eprintln!("audit stopped");
    Ok(())
}

/// Writes a pass's findings and counts it.
fn publish(report: &PassReport, remembered: usize, args: &AuditArgs) {
    for finding in &report.findings {
        write(finding, args);
        metrics::counter!(metric::FINDINGS, "kind" => finding.kind.as_str()).increment(1);
    }
    metrics::counter!(metric::ROWS_READ).increment(report.rows_read);
    metrics::counter!(metric::RECORDS_READ).increment(report.records_read);
    metrics::counter!(metric::QUERIES).increment(report.queries);
    metrics::counter!(metric::PASSES).increment(1);
    metrics::gauge!(metric::CURSOR).set(report.cursor as f64);
    metrics::gauge!(metric::REMEMBERED).set(remembered as f64);
    if report.caught_up {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        metrics::gauge!(metric::CAUGHT_UP).set(now.as_secs_f64());
    }
    let summary = format!(
        "pass: {} effect rows and {} records read in {} queries, cursor {}, {} found{}",
        report.rows_read,
        report.records_read,
        report.queries,
        report.cursor,
        report.findings.len(),
        if report.caught_up {
            ""
        } else {
            " (not caught up)"
        }
    );
    match args.once {
        true => eprintln!("{summary}"),
        false => tracing::info!("{summary}"),
    }
}

/// A finding on standard output (JSON with `--json`, a line of text with
/// `--once`), or as a warning in the log of a running auditor.
fn write(finding: &Finding, args: &AuditArgs) {
    if args.json {
        println!(
            "{}",
            serde_json::to_string(finding).expect("a finding always serializes")
        );
    } else if args.once {
        println!("{finding}");
    } else {
        tracing::warn!(kind = finding.kind.as_str(), scope = ?finding.scope, key = %finding.key, "{finding}");
    }
}
