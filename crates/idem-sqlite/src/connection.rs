//! Connections to one SQLite file, kept off the async runtime.
//!
//! SQLite allows one writer at a time, so all writes go through a single
//! dedicated thread that owns the write connection and runs jobs in arrival
//! order; async callers wait on a oneshot channel and never block a runtime
//! worker. Reads run on the blocking pool with their own connections, which in
//! WAL mode see the last committed state without waiting for the writer: replays
//! do not queue behind writes.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use idem_core::{Error, ErrorKind, StoreError};
use rusqlite::{Connection, OpenFlags};
use tokio::sync::{Semaphore, oneshot};

use crate::error::map_error;
use crate::lease_writes::{LeaseAnswer, LeaseContext, LeaseJob, ended_early};

/// How hard SQLite works to make a commit durable (`PRAGMA synchronous`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Synchronous {
    /// Every commit is on disk before it returns, even after a power cut. The default.
    #[default]
    Full,
    /// In WAL mode, safe against a process crash; the last commits may be lost in
    /// a power cut.
    Normal,
}

impl Synchronous {
    fn pragma(self) -> &'static str {
        match self {
            Self::Full => "FULL",
            Self::Normal => "NORMAL",
        }
    }
}

/// How connections are opened.
#[derive(Debug, Clone)]
pub(crate) struct ConnectionOptions {
    /// Durability of commits.
    pub synchronous: Synchronous,
    /// How long a statement waits for another process's write lock.
    pub busy_timeout: Duration,
}

impl Default for ConnectionOptions {
    fn default() -> Self {
        Self {
            synchronous: Synchronous::Full,
            busy_timeout: Duration::from_secs(5),
        }
    }
}

/// Delivers a grouped job's result once the group's commit is known: `None`
/// when it committed, the commit's error otherwise.
type Deliver = Box<dyn FnOnce(Option<&Error>) + Send>;

/// A grouped job: runs its writes in the shared transaction (`None`: none could
/// be started) and returns how to deliver its result once the commit is known.
type GroupedJob = Box<dyn FnOnce(Option<&mut Connection>) -> Deliver + Send>;

/// Work for the writer thread.
enum Job {
    /// Runs alone, managing its own transaction (atomic apply, whose effect is
    /// handed the transaction itself).
    Alone(Box<dyn FnOnce(&mut Connection) + Send>),
    /// Runs inside a transaction shared with the other grouped jobs queued at the
    /// same moment, in its own savepoint, and is answered only after that
    /// transaction committed: group commit, one disk flush for many small writes.
    /// `None` means no transaction could be started.
    Grouped(GroupedJob),
    /// A leased claim or completion, decided and written by the writer in the
    /// same shared transaction, without a savepoint (see `lease_writes`).
    Lease(LeaseJob),
}

impl Job {
    /// Answers a job of a group with `error`, without running it.
    fn refuse(self, error: &Error) {
        match self {
            Self::Grouped(job) => job(None)(Some(error)),
            Self::Lease(job) => job.refuse(error),
            Self::Alone(_) => unreachable!("jobs that run alone are not grouped"),
        }
    }
}

/// A grouped job's answer, sent once its transaction's commit is known.
enum Answer {
    Grouped(Deliver),
    Lease(LeaseAnswer),
}

impl Answer {
    fn send(self, commit_error: Option<&Error>) {
        match self {
            Self::Grouped(deliver) => deliver(commit_error),
            Self::Lease(answer) => answer.send(commit_error),
        }
    }
}

/// Most grouped jobs committed together.
const MAX_GROUP: usize = 256;

/// Runs the writer's queue until every sender is gone. Grouped and lease jobs
/// queued at the same moment share one transaction; the two vectors are kept
/// from one group to the next, so a group allocates nothing of its own.
fn serve(conn: &mut Connection, jobs: &mpsc::Receiver<Job>, context: &LeaseContext) {
    let mut group = Vec::with_capacity(MAX_GROUP);
    let mut answers = Vec::with_capacity(MAX_GROUP);
    let mut next = jobs.recv().ok();
    while let Some(job) = next.take() {
        match job {
            Job::Alone(run) => run(conn),
            first => {
                group.push(first);
                while group.len() < MAX_GROUP {
                    match jobs.try_recv() {
                        Ok(alone @ Job::Alone(_)) => {
                            next = Some(alone);
                            break;
                        }
                        Ok(more) => group.push(more),
                        Err(_) => break,
                    }
                }
                commit_group(conn, context, &mut group, &mut answers);
            }
        }
        if next.is_none() {
            next = jobs.recv().ok();
        }
    }
}

/// Runs `group` in one transaction, commits once, then answers every job.
/// A job that ends the transaction before its commit (an error that rolls it
/// back, an effect that commits or rolls back itself) gets the jobs before it
/// answered with an error, never as committed; the rest of the group goes on
/// in a new transaction.
fn commit_group(
    conn: &mut Connection,
    context: &LeaseContext,
    group: &mut Vec<Job>,
    answers: &mut Vec<Answer>,
) {
    if let Err(error) = begin(conn) {
        group.drain(..).for_each(|job| job.refuse(&error));
        return;
    }
    let mut jobs = group.drain(..);
    while let Some(job) = jobs.next() {
        answers.push(match job {
            Job::Grouped(run) => Answer::Grouped(run(Some(&mut *conn))),
            Job::Lease(job) => Answer::Lease(job.run(conn, context)),
            Job::Alone(_) => unreachable!("jobs that run alone are not grouped"),
        });
        if conn.is_autocommit() {
            let ended = ended_early();
            answers
                .drain(..)
                .for_each(|answer| answer.send(Some(&ended)));
            if let Err(error) = begin(conn) {
                jobs.by_ref().for_each(|job| job.refuse(&error));
                return;
            }
        }
    }
    drop(jobs);
    let committed = conn
        .prepare_cached("COMMIT")
        .and_then(|mut commit| commit.execute([]))
        .map_err(|e| map_error("commit", e));
    if committed.is_err() && !conn.is_autocommit() {
        let _ = conn.execute_batch("ROLLBACK");
    }
    let commit_error = committed.as_ref().err();
    answers
        .drain(..)
        .for_each(|answer| answer.send(commit_error));
}

/// Begins the shared write transaction (`BEGIN IMMEDIATE`, a cached statement).
fn begin(conn: &Connection) -> Result<(), Error> {
    conn.prepare_cached("BEGIN IMMEDIATE")
        .and_then(|mut begin| begin.execute([]))
        .map(drop)
        .map_err(|e| map_error("begin a write transaction", e))
}

/// The most read connections open at once. Each keeps its own page cache (up
/// to 2 MiB once a count over the records has filled it) and a file handle, so
/// the pool is bounded: reads beyond this many wait for a connection instead
/// of opening one more, and the store's memory does not follow its busiest
/// moment.
pub(crate) const MAX_READERS: usize = 8;

/// The writer thread's queue and a bounded pool of read connections.
#[derive(Debug)]
pub(crate) struct Connections {
    path: PathBuf,
    options: ConnectionOptions,
    writer: mpsc::Sender<Job>,
    idle_readers: Arc<Mutex<Vec<Connection>>>,
    readers: Arc<Semaphore>,
}

fn open(path: &Path, options: &ConnectionOptions) -> Result<Connection, Error> {
    let doing = format!("open the SQLite database at {}", path.display());
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_CREATE
            | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|e| map_error(&doing, e))?;
    conn.busy_timeout(options.busy_timeout)
        .map_err(|e| map_error(&doing, e))?;
    let mode: String = conn
        .query_row("PRAGMA journal_mode = WAL", [], |row| row.get(0))
        .map_err(|e| map_error(&doing, e))?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(StoreError::new(
            ErrorKind::Config,
            format!(
                "{} cannot use write-ahead logging (journal mode is {mode}); use a file on a local disk",
                path.display()
            ),
        )
        .into());
    }
    conn.pragma_update(None, "synchronous", options.synchronous.pragma())
        .map_err(|e| map_error(&doing, e))?;
    conn.set_prepared_statement_cache_capacity(64);
    Ok(conn)
}

impl Connections {
    /// Opens the write connection, runs `setup` on it (migrations), and starts
    /// the writer thread.
    pub(crate) async fn open(
        path: PathBuf,
        options: ConnectionOptions,
        context: LeaseContext,
        setup: impl FnOnce(&mut Connection) -> Result<(), Error> + Send + 'static,
    ) -> Result<Self, Error> {
        let (writer, jobs) = mpsc::channel::<Job>();
        let (opened_tx, opened_rx) = oneshot::channel();
        let thread_path = path.clone();
        let thread_options = options.clone();
        std::thread::Builder::new()
            .name("idem-sqlite-writer".into())
            .spawn(move || {
                let mut conn = match open(&thread_path, &thread_options)
                    .and_then(|mut c| setup(&mut c).map(|()| c))
                {
                    Ok(conn) => {
                        let _ = opened_tx.send(Ok(()));
                        conn
                    }
                    Err(e) => {
                        let _ = opened_tx.send(Err(e));
                        return;
                    }
                };
                serve(&mut conn, &jobs, &context);
            })
            .map_err(|e| {
                StoreError::with_source(
                    ErrorKind::Other,
                    "could not start the SQLite writer thread",
                    e,
                )
            })?;
        opened_rx.await.map_err(|_| stopped())??;
        Ok(Self {
            path,
            options,
            writer,
            idle_readers: Arc::new(Mutex::new(Vec::new())),
            readers: Arc::new(Semaphore::new(MAX_READERS)),
        })
    }

    /// The database file.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Runs `job` on the writer thread and waits for its result. A panic inside
    /// the job (for example in a user's effect) rolls back its transaction and is
    /// reported as an error; the writer keeps serving.
    pub(crate) async fn write<R: Send + 'static>(
        &self,
        job: impl FnOnce(&mut Connection) -> R + Send + 'static,
    ) -> Result<R, Error> {
        let (done_tx, done_rx) = oneshot::channel();
        let job = Job::Alone(Box::new(move |conn| {
            let result = catch_unwind(AssertUnwindSafe(|| job(conn)));
            if result.is_err() && !conn.is_autocommit() {
                let _ = conn.execute_batch("ROLLBACK");
            }
            let _ = done_tx.send(result.map_err(|_| ()));
        }));
        self.writer.send(job).map_err(|_| stopped())?;
        match done_rx.await.map_err(|_| stopped())? {
            Ok(value) => Ok(value),
            Err(()) => Err(StoreError::new(
                ErrorKind::Other,
                "a job on the SQLite writer panicked (most likely the effect); its transaction was rolled back",
            )
            .into()),
        }
    }

    /// Runs `job` on the writer inside a transaction shared with the other small
    /// writes queued at the same moment (each in its own savepoint, so a failing
    /// job undoes only its own changes), and answers once that transaction has
    /// committed. Under concurrency many claims and completions share one commit
    /// and one disk flush; alone, a job costs what a transaction of its own would.
    pub(crate) async fn write_grouped<R, X>(
        &self,
        job: impl FnOnce(&mut Connection) -> Result<R, X> + Send + 'static,
    ) -> Result<R, X>
    where
        R: Send + 'static,
        X: From<Error> + Send + 'static,
    {
        let (done_tx, done_rx) = oneshot::channel::<Result<R, X>>();
        let grouped = Job::Grouped(Box::new(move |conn: Option<&mut Connection>| -> Deliver {
            let Some(conn) = conn else {
                return Box::new(move |error: Option<&Error>| {
                    let _ = done_tx.send(Err(error
                        .map_or_else(stopped, Error::copy_for_group)
                        .into()));
                });
            };
            let result = in_savepoint(conn, job);
            Box::new(move |commit_error: Option<&Error>| {
                let _ = done_tx.send(match commit_error {
                    None => result,
                    Some(error) => Err(error.copy_for_group().into()),
                });
            })
        }));
        self.writer.send(grouped).map_err(|_| stopped())?;
        done_rx.await.map_err(|_| X::from(stopped()))?
    }

    /// Sends a lease job to the writer and waits for its answer, which comes
    /// once the transaction it was written in has committed.
    pub(crate) async fn lease<R>(
        &self,
        job: LeaseJob,
        answer: oneshot::Receiver<Result<R, Error>>,
    ) -> Result<R, Error> {
        self.writer.send(Job::Lease(job)).map_err(|_| stopped())?;
        answer.await.map_err(|_| stopped())?
    }

    /// Runs `job` on a read connection on the blocking pool, once one of the
    /// [`MAX_READERS`] is free.
    pub(crate) async fn read<R: Send + 'static>(
        &self,
        job: impl FnOnce(&Connection) -> Result<R, Error> + Send + 'static,
    ) -> Result<R, Error> {
        let idle = Arc::clone(&self.idle_readers);
        let path = self.path.clone();
        let options = self.options.clone();
        let permit = Arc::clone(&self.readers)
            .acquire_owned()
            .await
            .map_err(|_| stopped())?;
        tokio::task::spawn_blocking(move || {
            let _permit = permit;
            let taken = idle.lock().expect("reader pool poisoned").pop();
            let conn = match taken {
                Some(conn) => conn,
                None => open(&path, &options)?,
            };
            let result = job(&conn);
            idle.lock().expect("reader pool poisoned").push(conn);
            result
        })
        .await
        .map_err(|e| {
            Error::from(StoreError::with_source(
                ErrorKind::Other,
                "a read on the SQLite store panicked",
                e,
            ))
        })?
    }
}

/// Runs `job` in a savepoint of the open transaction: kept when it succeeds,
/// rolled back (alone) when it fails or panics.
fn in_savepoint<R, X: From<Error>>(
    conn: &mut Connection,
    job: impl FnOnce(&mut Connection) -> Result<R, X>,
) -> Result<R, X> {
    conn.execute_batch("SAVEPOINT idem_job")
        .map_err(|e| map_error("open a savepoint", e))?;
    let outcome = catch_unwind(AssertUnwindSafe(|| job(conn)));
    if conn.is_autocommit() {
        return Err(Error::from(StoreError::new(
            ErrorKind::Other,
            "the effect ended the store's transaction itself (COMMIT or ROLLBACK), so the \
             record could not commit with it; leave committing to the store",
        ))
        .into());
    }
    let keep = matches!(outcome, Ok(Ok(_)));
    let close = if keep {
        "RELEASE idem_job"
    } else {
        "ROLLBACK TO idem_job; RELEASE idem_job"
    };
    conn.execute_batch(close)
        .map_err(|e| map_error("close a savepoint", e))?;
    match outcome {
        Ok(result) => result,
        Err(_) => Err(Error::from(StoreError::new(
            ErrorKind::Other,
            "a write on the SQLite writer panicked; its changes were rolled back",
        ))
        .into()),
    }
}

fn stopped() -> Error {
    StoreError::new(
        ErrorKind::Unavailable,
        "the SQLite writer thread has stopped",
    )
    .into()
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_burst_of_reads_opens_at_most_the_pools_connections() {
        let dir = tempfile::tempdir().unwrap();
        let connections = Connections::open(
            dir.path().join("idem.db"),
            ConnectionOptions::default(),
            LeaseContext {
                settings: idem_core::Settings::default(),
                clock: Arc::new(idem_core::SystemClock),
            },
            |_| Ok(()),
        )
        .await
        .unwrap();
        let running = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let reads = (0..64).map(|_| {
            let (running, most) = (Arc::clone(&running), Arc::clone(&most));
            connections.read(move |conn| {
                let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(5));
                let one: i64 = conn
                    .query_row("SELECT 1", [], |r| r.get(0))
                    .map_err(|e| map_error("read", e))?;
                running.fetch_sub(1, Ordering::SeqCst);
                Ok(one)
            })
        });
        let answers = futures::future::join_all(reads).await;
        assert!(answers.into_iter().all(|a| a.unwrap() == 1));
        assert!(most.load(Ordering::SeqCst) <= MAX_READERS);
        let idle = connections.idle_readers.lock().unwrap().len();
        assert!((1..=MAX_READERS).contains(&idle), "{idle} idle readers");
    }
}
