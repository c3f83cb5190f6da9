//! The live auditor as a panel of the console: the console process runs
//! the auditor's passes ([`idem_check::audit::Audit`]) over the service's
//! effect log and the store's records, and keeps what the panel shows:
//! counters per kind of finding, where the cursor stands, when the last
//! pass ran, and the latest findings with the keys and rows involved.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use idem::{AnyStore, OutboxStore};
use idem_check::audit::{
    Audit, AuditError, AuditSettings, Auditor, EffectLog, Finding, FindingKind, PassLimits,
    PassReport,
};
use serde::Serialize;
use utoipa::ToSchema;

/// The most findings the panel keeps.
pub const FINDINGS_KEPT: usize = 200;

/// How the console runs the auditor: what it compares and how patiently
/// (the auditor's own [`AuditSettings`] and [`PassLimits`]), how often, and
/// where in the effect log it starts.
#[derive(Debug, Clone)]
pub struct AuditorOptions {
    /// The effects query, as shown on the panel.
    pub effects_query: String,
    /// The query's cursor column.
    pub cursor_column: String,
    /// The scopes, window and grace period.
    pub settings: AuditSettings,
    /// Rows per query and the pause between queries.
    pub limits: PassLimits,
    /// The wait between two passes.
    pub interval: Duration,
    /// Start after this cursor value instead of at the beginning of the
    /// log; records claimed before then are not checked for their effect.
    pub after: Option<i64>,
}

/// How the auditor is configured, as the panel shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct AuditorConfig {
    /// The effects query.
    pub effects_query: String,
    /// Its cursor column.
    pub cursor_column: String,
    /// The audited scopes.
    pub scopes: Vec<String>,
    /// The dedupe window, in milliseconds.
    pub window_ms: u64,
    /// The grace period, in milliseconds.
    pub grace_ms: u64,
    /// Rows per query.
    pub batch: usize,
    /// The pause between two queries of a pass, in milliseconds.
    pub pause_ms: u64,
    /// The wait between two passes, in milliseconds.
    pub interval_ms: u64,
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

impl From<&AuditorOptions> for AuditorConfig {
    fn from(options: &AuditorOptions) -> Self {
        Self {
            effects_query: options.effects_query.clone(),
            cursor_column: options.cursor_column.clone(),
            scopes: options
                .settings
                .scopes
                .iter()
                .map(|s| s.as_str().to_owned())
                .collect(),
            window_ms: millis(options.settings.window),
            grace_ms: millis(options.settings.grace),
            batch: options.limits.batch,
            pause_ms: millis(options.limits.pause),
            interval_ms: millis(options.interval),
        }
    }
}

/// One effect row of a finding.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct EffectRowView {
    /// Its cursor value (the row).
    pub cursor: i64,
    /// When it was written, when the log says.
    pub at_ms: Option<i64>,
    /// Its resource, when the log names one.
    pub resource: Option<String>,
    /// Its fencing token, when the log has one.
    pub fence: Option<i64>,
}

/// The record a finding read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct RecordSeenView {
    /// `in_flight`, `completed` or `failed`.
    pub state: String,
    /// Its fencing token.
    pub token: i64,
    /// When the key was first claimed.
    pub created_at_ms: i64,
    /// When it last changed.
    pub updated_at_ms: i64,
}

/// A finding as the panel shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct FindingView {
    /// `double_effect`, `missing_effect` or `effect_without_record`.
    pub kind: String,
    /// The key's scope, when known.
    pub scope: Option<String>,
    /// The key.
    pub key: String,
    /// The effect rows involved.
    pub effects: Vec<EffectRowView>,
    /// For a double effect, how many effects the key has had in its window.
    pub count: Option<u32>,
    /// The key's record, where one was read.
    pub record: Option<RecordSeenView>,
    /// When it was found.
    pub found_at_ms: i64,
    /// The finding in words.
    pub text: String,
}

impl From<&Finding> for FindingView {
    fn from(finding: &Finding) -> Self {
        Self {
            kind: finding.kind.as_str().to_owned(),
            scope: finding.scope.clone(),
            key: finding.key.clone(),
            effects: finding
                .effects
                .iter()
                .map(|e| EffectRowView {
                    cursor: e.cursor,
                    at_ms: e.at_ms,
                    resource: e.effect.resource.clone(),
                    fence: e.effect.fence,
                })
                .collect(),
            count: finding.count,
            record: finding.record.as_ref().map(|r| RecordSeenView {
                state: r.state.to_owned(),
                token: r.token,
                created_at_ms: r.created_at_ms,
                updated_at_ms: r.updated_at_ms,
            }),
            found_at_ms: finding.found_at_ms,
            text: finding.to_string(),
        }
    }
}

/// The auditor panel: how it is configured and what it found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct AuditorView {
    /// Whether the store can be audited: the auditor reads the effect log
    /// with SQL on the store's database, which a Redis or DynamoDB store
    /// does not have.
    pub available: bool,
    /// Whether this console runs an auditor; when not, the rest is empty.
    pub configured: bool,
    /// Its configuration.
    pub config: Option<AuditorConfig>,
    /// Findings so far, by kind (every kind listed, zero included).
    pub findings_by_kind: BTreeMap<String, u64>,
    /// The last cursor value read from the effect log.
    pub cursor: Option<i64>,
    /// Passes completed.
    pub passes: u64,
    /// Passes that failed.
    pub errors: u64,
    /// When the last pass ended (good or failed).
    pub last_pass_ms: Option<i64>,
    /// When a pass last read the effect log to its end.
    pub caught_up_ms: Option<i64>,
    /// Why the last pass failed, when it did.
    pub last_error: Option<String>,
    /// Effect rows read so far.
    pub rows_read: u64,
    /// Records read so far.
    pub records_read: u64,
    /// Queries run so far.
    pub queries: u64,
    /// Keys remembered with their first effect in the window.
    pub remembered_keys: usize,
    /// The latest findings (at most 200), newest first.
    pub latest: Vec<FindingView>,
}

/// What the running auditor has told the panel.
#[derive(Debug, Default)]
struct Seen {
    config: Option<AuditorConfig>,
    by_kind: BTreeMap<&'static str, u64>,
    cursor: Option<i64>,
    passes: u64,
    errors: u64,
    last_pass_ms: Option<i64>,
    caught_up_ms: Option<i64>,
    last_error: Option<String>,
    rows_read: u64,
    records_read: u64,
    queries: u64,
    remembered: usize,
    latest: VecDeque<FindingView>,
}

/// The panel's memory, shared by the auditor's task and the handlers.
#[derive(Debug, Default)]
pub(crate) struct Panel {
    seen: Mutex<Seen>,
}

impl Panel {
    fn configure(&self, config: AuditorConfig) {
        let mut seen = self.seen.lock().expect("panel lock");
        seen.config = Some(config);
        for kind in FindingKind::ALL {
            seen.by_kind.insert(kind.as_str(), 0);
        }
    }

    fn record(&self, pass: &Result<PassReport, AuditError>, auditor: &Auditor, now_ms: i64) {
        let mut seen = self.seen.lock().expect("panel lock");
        seen.last_pass_ms = Some(now_ms);
        seen.remembered = auditor.remembered();
        match pass {
            Ok(report) => {
                seen.passes += 1;
                seen.last_error = None;
                seen.cursor = Some(report.cursor);
                seen.rows_read += report.rows_read;
                seen.records_read += report.records_read;
                seen.queries += report.queries;
                if report.caught_up {
                    seen.caught_up_ms = Some(now_ms);
                }
                for finding in &report.findings {
                    *seen.by_kind.entry(finding.kind.as_str()).or_default() += 1;
                    seen.latest.push_front(FindingView::from(finding));
                }
                seen.latest.truncate(FINDINGS_KEPT);
            }
            Err(error) => {
                seen.errors += 1;
                seen.last_error = Some(idem::error_chain(error));
            }
        }
    }

    /// What the panel shows now, for `store`.
    pub(crate) fn view(&self, store: &AnyStore) -> AuditorView {
        let seen = self.seen.lock().expect("panel lock");
        AuditorView {
            available: store.offers_atomic_mode(),
            configured: seen.config.is_some(),
            config: seen.config.clone(),
            findings_by_kind: seen
                .by_kind
                .iter()
                .map(|(kind, n)| ((*kind).to_owned(), *n))
                .collect(),
            cursor: seen.cursor,
            passes: seen.passes,
            errors: seen.errors,
            last_pass_ms: seen.last_pass_ms,
            caught_up_ms: seen.caught_up_ms,
            last_error: seen.last_error.clone(),
            rows_read: seen.rows_read,
            records_read: seen.records_read,
            queries: seen.queries,
            remembered_keys: seen.remembered,
            latest: seen.latest.iter().cloned().collect(),
        }
    }
}

/// Runs the auditor over `log` and `store` as `options` say, telling
/// `panel` after each pass, until the task is aborted.
pub(crate) async fn run<L: EffectLog + 'static>(
    panel: std::sync::Arc<Panel>,
    store: AnyStore,
    log: L,
    options: AuditorOptions,
) {
    panel.configure(AuditorConfig::from(&options));
    let clock = store.outbox_clock();
    let mut audit = Audit::new(
        log,
        store,
        clock.clone(),
        options.settings,
        options.limits,
        options.after.unwrap_or(i64::MIN),
    );
    if options.after.is_some() {
        // Records claimed before the start have effects before the cursor,
        // which the auditor will not read: they are not judged.
        let start = clock.now();
        while let Err(error) = audit.skip_records_before(start).await {
            tracing::warn!(error = %idem::error_chain(&error), "cannot read the store's records; trying again");
            let failed: Result<PassReport, AuditError> = Err(error);
            panel.record(&failed, audit.auditor(), clock.now().0);
            tokio::time::sleep(options.interval).await;
        }
    }
    audit
        .run_every(options.interval, std::future::pending(), |pass, auditor| {
            if let Err(error) = &pass {
                tracing::warn!(error = %idem::error_chain(error), "the audit pass failed; trying again at the next one");
            }
            panel.record(&pass, auditor, clock.now().0);
        })
        .await;
}
