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
use tokio::sync::oneshot;

use crate::errors::map_err;

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
pub struct ConnectionOptions {
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

type Job = Box<dyn FnOnce(&mut Connection) + Send>;

/// The writer thread's queue and a pool of idle read connections.
#[derive(Debug)]
pub struct Connections {
    path: PathBuf,
    options: ConnectionOptions,
    writer: mpsc::Sender<Job>,
    idle_readers: Arc<Mutex<Vec<Connection>>>,
}

fn open(path: &Path, options: &ConnectionOptions) -> Result<Connection, Error> {
    let doing = format!("open the SQLite database at {}", path.display());
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_CREATE
            | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|e| map_err(&doing, e))?;
    conn.busy_timeout(options.busy_timeout)
        .map_err(|e| map_err(&doing, e))?;
    let mode: String = conn
        .query_row("PRAGMA journal_mode = WAL", [], |row| row.get(0))
        .map_err(|e| map_err(&doing, e))?;
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
        .map_err(|e| map_err(&doing, e))?;
    conn.set_prepared_statement_cache_capacity(64);
    Ok(conn)
}

impl Connections {
    /// Opens the write connection, runs `setup` on it (migrations), and starts
    /// the writer thread.
    pub async fn open(
        path: PathBuf,
        options: ConnectionOptions,
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
                while let Ok(job) = jobs.recv() {
                    job(&mut conn);
                }
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
        })
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Runs `job` on the writer thread and waits for its result. A panic inside
    /// the job (for example in a user's effect) rolls back its transaction and is
    /// reported as an error; the writer keeps serving.
    pub async fn write<R: Send + 'static>(
        &self,
        job: impl FnOnce(&mut Connection) -> R + Send + 'static,
    ) -> Result<R, Error> {
        let (done_tx, done_rx) = oneshot::channel();
        let job: Job = Box::new(move |conn| {
            let result = catch_unwind(AssertUnwindSafe(|| job(conn)));
            if result.is_err() && !conn.is_autocommit() {
                let _ = conn.execute_batch("ROLLBACK");
            }
            let _ = done_tx.send(result.map_err(|_| ()));
        });
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

    /// Runs `job` on a read connection on the blocking pool.
    pub async fn read<R: Send + 'static>(
        &self,
        job: impl FnOnce(&Connection) -> Result<R, Error> + Send + 'static,
    ) -> Result<R, Error> {
        let idle = Arc::clone(&self.idle_readers);
        let path = self.path.clone();
        let options = self.options.clone();
        tokio::task::spawn_blocking(move || {
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

fn stopped() -> Error {
    StoreError::new(
        ErrorKind::Unavailable,
        "the SQLite writer thread has stopped",
    )
    .into()
}
