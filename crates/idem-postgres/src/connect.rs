//! Which of several servers a connection goes to, chosen again on every new
//! connection, so that a pool follows a failover to the new primary.
//!
//! sqlx's pool connects to one set of options and has no hook that connects
//! for it. So [`Failover`] works around the pool's own connecting, with the
//! three hooks it does have:
//!
//! - every new connection is checked against `target_session_attrs`
//!   (`after_connect`); one to a server that does not suit (the old primary,
//!   back as a standby) is swapped for one found by trying the hosts in
//!   order, as libpq does;
//! - when an operation (the store's statements or an effect's) fails as if
//!   its server went away, or the server refuses a write as read-only
//!   (SQLSTATE `25006`), the store calls [`Failover::noticed`]: the hosts are
//!   tried in the background until one suits, and the pool is pointed at it
//!   (while its host refuses connections, sqlx's pool retries that host and
//!   never reaches `after_connect`);
//! - after a switch the pool's idle connections are closed, and a pooled
//!   connection opened before it is dropped when next acquired
//!   (`before_acquire`; for a while the store does not take idle connections
//!   the quick way, which skips that hook), so none stays on the now-standby.
//!
//! Nothing here decides the fate of a key: the operation that failed has
//! already been answered as retryable (or, past a COMMIT, as of unknown
//! outcome); this only makes the retry find the primary.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use sqlx::postgres::{PgConnectOptions, PgConnection, PgPool};
use sqlx::{ConnectOptions, Connection, Row};

use idem_core::ErrorKind;

use crate::hosts::{HostList, TargetSessionAttrs};

/// How long the background search goes on without finding a server before
/// it stops; the next failure starts another.
const SEARCH_FOR: Duration = Duration::from_secs(30);

/// How long after a switch every pooled connection is checked when
/// acquired (by then each one opened before it has been acquired, or closed).
const STALE_FOR: Duration = Duration::from_secs(30);

/// The longest pause between two rounds of the background search.
const MOST_BETWEEN_ROUNDS: Duration = Duration::from_millis(500);

/// SQLSTATE `read_only_sql_transaction`: a write sent to a standby.
const READ_ONLY: &str = "25006";

/// What a switch points at another server: the connection pool of an open
/// store (the store's shared state implements it).
pub(crate) trait PoolOwner: Send + Sync {
    fn pool(&self) -> &PgPool;
}

/// The servers of a multi-host URL and which of them the pool uses.
pub(crate) struct Failover {
    list: HostList,
    servers: Vec<PgConnectOptions>,
    /// How long one host is given to accept a connection and answer.
    probe_timeout: Duration,
    state: Mutex<State>,
    searching: AtomicBool,
    /// The handles on the store (one per `with_group_commit`), to point
    /// their shared pool at another server (weak: the pool's hooks hold this
    /// value, and the store holds the pool).
    stores: Mutex<Vec<Weak<dyn PoolOwner>>>,
}

struct State {
    /// The index of the server the pool connects to.
    current: usize,
    /// Pooled connections opened before this are dropped when acquired.
    stale_before: Option<Instant>,
}

impl Failover {
    /// The servers `list` names (`servers`, one per host, in its order).
    pub(crate) fn new(
        list: HostList,
        servers: Vec<PgConnectOptions>,
        probe_timeout: Duration,
    ) -> Self {
        Self {
            list,
            servers,
            probe_timeout,
            state: Mutex::new(State {
                current: 0,
                stale_before: None,
            }),
            searching: AtomicBool::new(false),
            stores: Mutex::default(),
        }
    }

    /// The options of the server the pool connects to now.
    pub(crate) fn current_server(&self) -> PgConnectOptions {
        self.servers[self.lock().current].clone()
    }

    /// Lets the search point `store`'s pool at the server it finds.
    pub(crate) fn attach(&self, store: Weak<dyn PoolOwner>) {
        let mut stores = self.stores.lock().unwrap_or_else(|e| e.into_inner());
        stores.retain(|store| store.strong_count() > 0);
        stores.push(store);
    }

    /// A handle on the store, while one is open.
    fn store(&self) -> Option<Arc<dyn PoolOwner>> {
        let stores = self.stores.lock().unwrap_or_else(|e| e.into_inner());
        stores.iter().find_map(Weak::upgrade)
    }

    /// The first server, in the URL's order, that accepts a connection and
    /// suits `target_session_attrs`; remembered as the current one.
    pub(crate) async fn find(&self) -> Result<PgConnection, sqlx::Error> {
        let (index, conn) = self.search().await?;
        self.switch_to(index, false);
        Ok(conn)
    }

    /// `after_connect`: keeps a new connection that suits, or replaces it
    /// with one that does.
    pub(crate) async fn check(&self, conn: &mut PgConnection) -> Result<(), sqlx::Error> {
        let want = match self.list.target {
            TargetSessionAttrs::Any => return Ok(()),
            TargetSessionAttrs::PreferStandby => TargetSessionAttrs::Standby,
            other => other,
        };
        if suits(conn, want).await? {
            return Ok(());
        }
        let found = self.find().await?;
        let old = std::mem::replace(conn, found);
        if let Err(error) = old.close().await {
            tracing::debug!(%error, "closing a connection to a server that does not suit failed");
        }
        Ok(())
    }

    /// `before_acquire`: whether a pooled connection, opened `age` ago, was
    /// opened after the last switch of server.
    pub(crate) fn is_fresh(&self, age: Duration) -> bool {
        match self.lock().stale_before {
            Some(switch) => Instant::now()
                .checked_sub(age)
                .is_some_and(|opened| opened >= switch),
            None => true,
        }
    }

    /// An operation failed with `error` of `kind`: when the server went away
    /// (or, past a COMMIT, may have), or refused a write as read-only
    /// (`25006`), the hosts are searched again.
    pub(crate) fn noticed(
        self: &Arc<Self>,
        kind: ErrorKind,
        error: &(dyn std::error::Error + 'static),
    ) {
        if matches!(kind, ErrorKind::Unavailable | ErrorKind::CommitUnknown) {
            let read_only = std::iter::successors(Some(error), |e| e.source())
                .filter_map(|e| e.downcast_ref::<sqlx::Error>())
                .filter_map(sqlx::Error::as_database_error)
                .any(|e| e.code().as_deref() == Some(READ_ONLY));
            self.lost(read_only);
        }
    }

    /// An operation failed as if its server went away (`read_only`: the
    /// server refused a write): searches the hosts again in the background.
    fn lost(self: &Arc<Self>, read_only: bool) {
        if read_only {
            // Every pooled connection may be on the now-standby.
            self.lock().stale_before = Some(Instant::now());
            self.drop_idle();
        }
        if self.searching.swap(true, Ordering::AcqRel) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            // Outside a runtime (an error classified by synchronous code):
            // the next failure inside one searches.
            self.searching.store(false, Ordering::Release);
            return;
        };
        let failover = self.clone();
        runtime.spawn(async move {
            let started = Instant::now();
            let mut pause = Duration::from_millis(20);
            loop {
                match failover.search().await {
                    Ok((index, conn)) => {
                        failover.switch_to(index, read_only);
                        if let Err(error) = conn.close().await {
                            tracing::debug!(%error, "closing the probe connection failed");
                        }
                        break;
                    }
                    Err(error) if started.elapsed() < SEARCH_FOR => {
                        tracing::debug!(%error, "no PostgreSQL server suits yet; trying again");
                    }
                    Err(error) => {
                        tracing::warn!(%error, "no PostgreSQL server suited for {} s; the next failure searches again", SEARCH_FOR.as_secs());
                        break;
                    }
                }
                if failover.store().is_none() {
                    break;
                }
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(MOST_BETWEEN_ROUNDS);
            }
            failover.searching.store(false, Ordering::Release);
        });
    }

    /// Whether the pool may still hold connections opened before the last
    /// switch, which the store must not take without `before_acquire`'s
    /// check (it takes idle connections with `try_acquire`, which skips it).
    pub(crate) fn recently_switched(&self) -> bool {
        self.lock()
            .stale_before
            .is_some_and(|switch| switch.elapsed() < STALE_FOR)
    }

    /// Closes the pool's idle connections (those in use are checked when
    /// next acquired): after a switch, they may be on the old server.
    fn drop_idle(&self) {
        let Some(store) = self.store() else {
            return;
        };
        let pool = store.pool();
        for _ in 0..pool.num_idle() {
            match pool.try_acquire() {
                Some(mut conn) => conn.close_on_drop(),
                None => break,
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Makes server `index` the current one: the pool connects to it from
    /// now on and, if it is another server (or `drop_older`), drops the
    /// connections it opened before.
    fn switch_to(&self, index: usize, drop_older: bool) {
        let changed = {
            let mut state = self.lock();
            let changed = state.current != index;
            state.current = index;
            if changed || drop_older {
                state.stale_before = Some(Instant::now());
            }
            changed
        };
        if changed || drop_older {
            self.drop_idle();
        }
        if changed {
            tracing::warn!(
                server = %label(&self.servers[index]),
                target_session_attrs = self.list.target.as_str(),
                "PostgreSQL: switching to another server of the URL"
            );
            metrics::counter!("store_server_switches_total").increment(1);
            if let Some(store) = self.store() {
                store
                    .pool()
                    .set_connect_options(self.servers[index].clone());
            }
        }
    }

    /// One round over the hosts, in order (for `prefer-standby`: a standby,
    /// else a second round for any server).
    async fn search(&self) -> Result<(usize, PgConnection), sqlx::Error> {
        let rounds: &[TargetSessionAttrs] = match self.list.target {
            TargetSessionAttrs::PreferStandby => {
                &[TargetSessionAttrs::Standby, TargetSessionAttrs::Any]
            }
            TargetSessionAttrs::Any => &[TargetSessionAttrs::Any],
            TargetSessionAttrs::ReadWrite => &[TargetSessionAttrs::ReadWrite],
            TargetSessionAttrs::ReadOnly => &[TargetSessionAttrs::ReadOnly],
            TargetSessionAttrs::Primary => &[TargetSessionAttrs::Primary],
            TargetSessionAttrs::Standby => &[TargetSessionAttrs::Standby],
        };
        let mut why = Vec::new();
        let mut refusal = None;
        for &want in rounds {
            for (index, options) in self.servers.iter().enumerate() {
                let host = label(options);
                let tried = tokio::time::timeout(self.probe_timeout, async {
                    let mut conn = options.connect().await?;
                    match suits(&mut conn, want).await {
                        Ok(true) => Ok(Some(conn)),
                        Ok(false) => {
                            let _ = conn.close().await;
                            Ok(None)
                        }
                        Err(error) => Err(error),
                    }
                })
                .await;
                match tried {
                    Ok(Ok(Some(conn))) => return Ok((index, conn)),
                    Ok(Ok(None)) => why.push(format!("{host} is {}", describe_not(want))),
                    Ok(Err(error)) => {
                        why.push(format!("{host}: {error}"));
                        if !matches!(error, sqlx::Error::Io(_)) {
                            refusal = Some(error);
                        }
                    }
                    Err(_elapsed) => why.push(format!(
                        "{host} did not answer within {} ms",
                        self.probe_timeout.as_millis()
                    )),
                }
            }
        }
        // A server that answered with a refusal (a wrong password, a missing
        // database) is reported as itself, with its own advice.
        if let Some(refusal) = refusal {
            return Err(refusal);
        }
        Err(sqlx::Error::Io(std::io::Error::new(
            std::io::ErrorKind::NotConnected,
            format!(
                "no server suits target_session_attrs={} ({})",
                self.list.target.as_str(),
                why.join("; ")
            ),
        )))
    }
}

/// `host:port` (`[::1]:5432`), or the socket directory, for messages.
fn label(options: &PgConnectOptions) -> String {
    match options.get_socket() {
        Some(path) => path.display().to_string(),
        None if options.get_host().contains(':') => {
            format!("[{}]:{}", options.get_host(), options.get_port())
        }
        None => format!("{}:{}", options.get_host(), options.get_port()),
    }
}

/// What a server that does not suit `want` is, for messages.
fn describe_not(want: TargetSessionAttrs) -> &'static str {
    match want {
        TargetSessionAttrs::ReadWrite => "read-only",
        TargetSessionAttrs::ReadOnly => "read-write",
        TargetSessionAttrs::Primary => "a standby (in recovery)",
        TargetSessionAttrs::Standby | TargetSessionAttrs::PreferStandby => {
            "a primary (not in recovery)"
        }
        TargetSessionAttrs::Any => "not usable",
    }
}

/// Whether the server behind `conn` suits `want` (libpq's checks, sent as
/// simple queries so that nothing is prepared on the connection).
async fn suits(conn: &mut PgConnection, want: TargetSessionAttrs) -> Result<bool, sqlx::Error> {
    let (sql, suiting) = match want {
        TargetSessionAttrs::Any | TargetSessionAttrs::PreferStandby => return Ok(true),
        TargetSessionAttrs::ReadWrite => ("SHOW transaction_read_only", "off"),
        TargetSessionAttrs::ReadOnly => ("SHOW transaction_read_only", "on"),
        TargetSessionAttrs::Primary => ("SELECT pg_is_in_recovery()::text", "false"),
        TargetSessionAttrs::Standby => ("SELECT pg_is_in_recovery()::text", "true"),
    };
    let row = sqlx::raw_sql(sql).fetch_one(&mut *conn).await?;
    let value: String = row.try_get(0)?;
    Ok(value == suiting)
}

#[cfg(test)]
mod tests {
    use std::str::FromStr;

    use super::*;
    use crate::hosts::take_hosts;

    fn failover(url: &str) -> Failover {
        let (base, list) = take_hosts(url).unwrap();
        let list = list.unwrap();
        let servers = list.servers(&PgConnectOptions::from_str(&base).unwrap());
        Failover::new(list, servers, Duration::from_secs(1))
    }

    #[test]
    fn servers_are_labelled_as_the_url_names_them() {
        let failover = failover("postgres://u:s3cret@db1:5433,[::1]:5434/db");
        let labels: Vec<String> = failover.servers.iter().map(label).collect();
        assert_eq!(labels, ["db1:5433", "[::1]:5434"]);
        assert_eq!(failover.current_server().get_host(), "db1");
    }

    #[test]
    fn a_switch_makes_older_connections_stale_and_newer_ones_fresh() {
        let failover = failover("postgres://u@a:1,b:2/db?target_session_attrs=read-write");
        assert!(failover.is_fresh(Duration::from_secs(3600)));
        assert!(!failover.recently_switched());

        failover.switch_to(1, false);
        assert_eq!(failover.current_server().get_host(), "b");
        assert!(failover.recently_switched());
        assert!(
            !failover.is_fresh(Duration::from_secs(3600)),
            "opened before"
        );
        assert!(failover.is_fresh(Duration::ZERO), "opened after");

        // Found again where it already was: nothing opened since is dropped.
        std::thread::sleep(Duration::from_millis(5));
        failover.switch_to(1, false);
        assert!(failover.is_fresh(Duration::from_millis(1)));
    }
}
