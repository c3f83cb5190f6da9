//! One pass of the auditor over the database: the new effect rows in
//! batches, the records of their keys, then the records old enough to
//! judge, with a pause between batches so the auditor's load on the
//! database stays bounded however far behind it starts.

use std::future::Future;
use std::time::Duration;

use idem_core::{RecordScan, SharedClock};

use super::auditor::{AuditSettings, Auditor};
use super::finding::Finding;
use crate::effects::LoggedEffect;
use crate::effects::query::QueryError;

/// Where the effect rows come from: pages past a cursor.
pub trait EffectLog: Send {
    /// At most `limit` rows whose cursor is greater than `after`, in cursor
    /// order.
    fn page(
        &mut self,
        after: i64,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<LoggedEffect>, QueryError>> + Send;
}

#[cfg(feature = "sqlite")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
impl EffectLog for crate::effects::query::SqlitePages {
    async fn page(&mut self, after: i64, limit: usize) -> Result<Vec<LoggedEffect>, QueryError> {
        crate::effects::query::SqlitePages::page(self, after, limit).await
    }
}

#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
impl EffectLog for crate::effects::query::PgPages {
    async fn page(&mut self, after: i64, limit: usize) -> Result<Vec<LoggedEffect>, QueryError> {
        crate::effects::query::PgPages::page(self, after, limit).await
    }
}

/// The effect log as a query on the store's own database, SQLite or
/// PostgreSQL.
#[derive(Debug)]
pub enum SqlLog {
    /// Pages of a query on a SQLite file.
    #[cfg(feature = "sqlite")]
    #[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
    Sqlite(crate::effects::query::SqlitePages),
    /// Pages of a query on a PostgreSQL database.
    #[cfg(feature = "postgres")]
    #[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
    Postgres(crate::effects::query::PgPages),
}

impl EffectLog for SqlLog {
    async fn page(&mut self, after: i64, limit: usize) -> Result<Vec<LoggedEffect>, QueryError> {
        match self {
            #[cfg(feature = "sqlite")]
            Self::Sqlite(pages) => pages.page(after, limit).await,
            #[cfg(feature = "postgres")]
            Self::Postgres(pages) => pages.page(after, limit).await,
        }
    }
}

/// How much one pass may ask of the database at a time.
#[derive(Debug, Clone, Copy)]
pub struct PassLimits {
    /// Rows (effects or records) per query.
    pub batch: usize,
    /// The wait between two queries of one pass.
    pub pause: Duration,
}

/// Why a pass stopped before its end.
#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    /// The effects query failed.
    #[error("cannot read the effect log")]
    Effects(#[from] QueryError),
    /// The store's records could not be read.
    #[error("cannot read the store's records")]
    Records(#[from] idem_core::Error),
}

/// What one pass read and found.
#[derive(Debug, Default)]
pub struct PassReport {
    /// Effect rows read.
    pub rows_read: u64,
    /// Records read (those of the effects' keys, those judged, those
    /// looked at again).
    pub records_read: u64,
    /// Queries run: effect pages and record reads.
    pub queries: u64,
    /// Everything it found, in the order found.
    pub findings: Vec<Finding>,
    /// The last cursor read.
    pub cursor: i64,
    /// Whether it read the effect log to its end; records are judged only
    /// then.
    pub caught_up: bool,
}

/// An auditor reading one effect log and one store.
#[derive(Debug)]
pub struct Audit<L, S> {
    log: L,
    store: S,
    clock: SharedClock,
    limits: PassLimits,
    auditor: Auditor,
    cursor: i64,
}

impl<L: EffectLog, S: RecordScan> Audit<L, S> {
    /// Audits `log` against `store`, starting after the cursor `after`
    /// (`i64::MIN` for the whole log).
    pub fn new(
        log: L,
        store: S,
        clock: SharedClock,
        settings: AuditSettings,
        limits: PassLimits,
        after: i64,
    ) -> Self {
        Self {
            log,
            store,
            clock,
            limits: PassLimits {
                batch: limits.batch.max(1),
                ..limits
            },
            auditor: Auditor::new(settings),
            cursor: after,
        }
    }

    /// The last cursor read.
    pub fn cursor(&self) -> i64 {
        self.cursor
    }

    /// The rules and memory.
    pub fn auditor(&self) -> &Auditor {
        &self.auditor
    }

    /// Starts the record walk after the records claimed before `before`:
    /// for an auditor that starts partway through the effect log, whose
    /// older records' effects it will not read.
    pub async fn skip_records_before(
        &mut self,
        before: idem_core::Timestamp,
    ) -> Result<(), AuditError> {
        let scopes = self.auditor.settings().scopes.clone();
        loop {
            let page = self
                .store
                .records_by_expiry(&scopes, self.auditor.position(), self.limits.batch)
                .await?;
            let older = page.iter().take_while(|r| r.created_at < before).count();
            if older == 0 {
                return Ok(());
            }
            self.auditor.skip_records(&page[..older]);
            if older < page.len() {
                return Ok(());
            }
            tokio::time::sleep(self.limits.pause).await;
        }
    }

    /// Reads the new effect rows to the end of the log, then judges the
    /// records that became old enough.
    pub async fn pass(&mut self) -> Result<PassReport, AuditError> {
        let mut report = PassReport::default();
        let batch = self.limits.batch;
        let mut first = true;
        loop {
            if !first {
                tokio::time::sleep(self.limits.pause).await;
            }
            first = false;
            let page = self.log.page(self.cursor, batch).await?;
            report.queries += 1;
            let Some(last) = page.last() else {
                report.caught_up = true;
                break;
            };
            self.cursor = last.cursor;
            report.rows_read += page.len() as u64;
            let keys = self.auditor.keys_to_look_up(&page);
            let records = match keys.is_empty() {
                true => Vec::new(),
                false => {
                    report.queries += 1;
                    self.store.records_of(&keys).await?
                }
            };
            report.records_read += records.len() as u64;
            let now = self.clock.now();
            report
                .findings
                .extend(self.auditor.read_effects(&page, &records, now));
            if page.len() < batch {
                report.caught_up = true;
                break;
            }
        }
        report.cursor = self.cursor;
        self.judge_records(&mut report).await?;
        self.auditor.forget_old(self.clock.now());
        Ok(report)
    }

    /// Runs a pass every `interval` until `stop` completes, handing each
    /// pass's outcome and the auditor to `on_pass`. A failed pass is handed
    /// over too; the next one tries again from where the last good one
    /// stopped.
    pub async fn run_every(
        &mut self,
        interval: Duration,
        stop: impl Future<Output = ()>,
        mut on_pass: impl FnMut(Result<PassReport, AuditError>, &Auditor),
    ) {
        tokio::pin!(stop);
        loop {
            tokio::select! {
                _ = &mut stop => return,
                pass = self.pass() => on_pass(pass, &self.auditor),
            }
            tokio::select! {
                _ = &mut stop => return,
                _ = tokio::time::sleep(interval) => {}
            }
        }
    }

    /// The records set aside, then the walk from where it stopped.
    async fn judge_records(&mut self, report: &mut PassReport) -> Result<(), AuditError> {
        // Only once every effect committed before now was read: a record
        // judged earlier could be missing an effect the log holds.
        if !report.caught_up {
            return Ok(());
        }
        let now = self.clock.now();
        let pending = self.auditor.pending();
        for keys in pending.chunks(self.limits.batch) {
            tokio::time::sleep(self.limits.pause).await;
            let records = self.store.records_of(keys).await?;
            report.queries += 1;
            report.records_read += records.len() as u64;
            report
                .findings
                .extend(self.auditor.recheck(keys, &records, now));
        }
        let scopes = self.auditor.settings().scopes.clone();
        loop {
            let page = self
                .store
                .records_by_expiry(&scopes, self.auditor.position(), self.limits.batch)
                .await?;
            report.queries += 1;
            report.records_read += page.len() as u64;
            let judged = self.auditor.judge_records(&page, now);
            report.findings.extend(judged.findings);
            if judged.reached_recent || page.len() < self.limits.batch {
                return Ok(());
            }
            tokio::time::sleep(self.limits.pause).await;
        }
    }
}
