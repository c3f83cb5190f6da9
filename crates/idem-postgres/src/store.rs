//! The store handle and how it is made: [`PgStore`], [`PgStoreBuilder`], and the
//! small helpers every protocol path shares (transactions, error mapping,
//! fencing refusals).

use std::fmt;
use std::panic::AssertUnwindSafe;
use std::str::FromStr;
use std::sync::{Arc, Weak};
use std::time::Duration;

use futures::FutureExt;
use idem_core::{
    AtomicEffect, Claim, Error, ErrorKind, FencingToken, Settings, SharedClock, StoreError,
    SystemClock, TxCall, observe,
};
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions, Postgres};
use sqlx::{Connection, Transaction};

use crate::connect::Failover;
use crate::error::{Endpoint, commit_error, kind_of_cause, store_error};
use crate::group::queues::Groups;
use crate::pooler::{OneShot, Pooling};
use crate::{lock, records};

/// The default size of the connection pool.
pub const DEFAULT_MAX_CONNECTIONS: u32 = 16;

/// How long an operation waits for a pooled connection by default before it
/// fails as unavailable.
pub const DEFAULT_ACQUIRE_TIMEOUT: Duration = Duration::from_secs(5);

/// An Idem store on PostgreSQL, shared by many processes and machines.
///
/// Cheap to clone: clones share one connection pool. Implements
/// [`LeaseStore`](idem_core::LeaseStore) and [`RecordStore`](idem_core::RecordStore),
/// and the atomic mode ([`AtomicStore`](idem_core::AtomicStore): `apply`,
/// `apply_batch`, `apply_set`) where the effect runs in the store's transaction.
#[derive(Clone)]
pub struct PgStore {
    inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pool: PgPool,
    settings: Settings,
    clock: SharedClock,
    endpoint: Endpoint,
    /// Whether leased claims and completions are committed in groups.
    group_commit: bool,
    groups: Groups,
    /// What stands between the store and the server (see `pooler`).
    pooling: Pooling,
    /// The servers of a multi-host URL, or `target_session_attrs`.
    failover: Option<Arc<Failover>>,
    /// Whether every claim and completion takes the key's advisory lock, as
    /// before the one-statement claim (see `leased`): a benchmark's baseline.
    locked_claims: bool,
}

impl crate::connect::PoolOwner for Inner {
    fn pool(&self) -> &PgPool {
        &self.pool
    }
}

impl fmt::Debug for PgStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgStore")
            .field("endpoint", &self.inner.endpoint)
            .field("settings", &self.inner.settings)
            .field("clock", &self.inner.clock)
            .field("group_commit", &self.inner.group_commit)
            .finish_non_exhaustive()
    }
}

impl PgStore {
    /// A builder for a store at `url` (`postgres://user@host:port/database`).
    pub fn builder(url: impl Into<String>) -> PgStoreBuilder {
        PgStoreBuilder {
            url: url.into(),
            settings: Settings::default(),
            clock: Arc::new(SystemClock),
            max_connections: DEFAULT_MAX_CONNECTIONS,
            acquire_timeout: DEFAULT_ACQUIRE_TIMEOUT,
            migrate: true,
            group_commit: true,
        }
    }

    /// Connects to `url` with the defaults (system clock, default settings, a
    /// pool of 16) and migrates the schema.
    pub async fn connect(url: &str) -> Result<PgStore, Error> {
        Self::builder(url).connect().await
    }

    /// A store over an existing pool, for applications that already have one.
    /// Does not migrate: call [`RecordStore::migrate`](idem_core::RecordStore::migrate)
    /// once if the schema may be missing.
    ///
    /// The atomic `apply` uses a few statements that each session prepares
    /// (named `idem_*_v1`). The store's own pool prepares them when it opens a
    /// connection; over this pool, each connection prepares them the first
    /// time it needs them, after one failed `EXECUTE` that the server logs.
    ///
    /// Leased claims and completions are committed in groups, as with
    /// [`PgStoreBuilder::group_commit`]'s default.
    pub fn from_pool(pool: PgPool, settings: Settings, clock: SharedClock) -> PgStore {
        let endpoint = Endpoint::of_pool(&pool);
        PgStore::of(pool, settings, clock, endpoint, true, None)
    }

    fn of(
        pool: PgPool,
        settings: Settings,
        clock: SharedClock,
        endpoint: Endpoint,
        group_commit: bool,
        failover: Option<Arc<Failover>>,
    ) -> PgStore {
        PgStore {
            inner: Arc::new(Inner {
                pool,
                settings,
                clock,
                endpoint,
                group_commit,
                groups: Groups::default(),
                pooling: Pooling::Direct,
                failover,
                locked_claims: false,
            }),
        }
    }

    /// A handle on the same pool, settings and clock with group commit of
    /// leased claims and completions on or off (see
    /// [`PgStoreBuilder::group_commit`]): the way to choose it for a store
    /// made with [`from_pool`](Self::from_pool).
    pub fn with_group_commit(&self, group: bool) -> PgStore {
        let inner = &self.inner;
        let store = PgStore::of(
            inner.pool.clone(),
            inner.settings.clone(),
            inner.clock.clone(),
            inner.endpoint.clone(),
            group,
            inner.failover.clone(),
        )
        .with_pooling(inner.pooling)
        .with_locked(inner.locked_claims);
        if let Some(failover) = &store.inner.failover {
            failover.attach(store.downgrade());
        }
        store
    }

    /// Benchmark hook: a handle on the same pool, settings and clock whose
    /// leased claims and completions take the key's advisory lock and read
    /// the record first, as they did before a new key was claimed in one
    /// statement (see `leased`), so that both ways can be measured in one
    /// run. The answers are the same; only the statements differ.
    #[doc(hidden)]
    pub fn with_locked_claims(&self) -> PgStore {
        let inner = &self.inner;
        let store = PgStore::of(
            inner.pool.clone(),
            inner.settings.clone(),
            inner.clock.clone(),
            inner.endpoint.clone(),
            inner.group_commit,
            inner.failover.clone(),
        )
        .with_pooling(inner.pooling)
        .with_locked(true);
        if let Some(failover) = &store.inner.failover {
            failover.attach(store.downgrade());
        }
        store
    }

    /// This store with `locked_claims`, for a store just made.
    fn with_locked(mut self, locked: bool) -> PgStore {
        match Arc::get_mut(&mut self.inner) {
            Some(inner) => inner.locked_claims = locked,
            None => unreachable!("a store just made has no other handle"),
        }
        self
    }

    /// Whether a leased claim tries the one-statement claim first and a
    /// completion is one fenced `UPDATE` (see `leased`): on a server session
    /// of the store's own (not through a transaction pooler, where a
    /// statement outside a transaction may not find the session's prepared
    /// statements) and without tombstones (whose check one statement
    /// cannot make against a concurrent sweep).
    pub(crate) fn claims_in_one_statement(&self) -> bool {
        !self.inner.locked_claims
            && self.pooling().sessions()
            && self.settings().tombstones.is_none()
    }

    /// This store with `pooling`, for a store just made.
    fn with_pooling(mut self, pooling: Pooling) -> PgStore {
        match Arc::get_mut(&mut self.inner) {
            Some(inner) => inner.pooling = pooling,
            None => unreachable!("a store just made has no other handle"),
        }
        self
    }

    /// What stands between the store and the server (see `pooler`).
    pub(crate) fn pooling(&self) -> Pooling {
        self.inner.pooling
    }

    /// A connection for statements outside any transaction of the caller's
    /// (see [`OneShot`]).
    pub(crate) async fn one_shot(&self) -> Result<OneShot, Error> {
        OneShot::open(self.pool(), self.pooling())
            .await
            .map_err(|e| self.fail(e))
    }

    /// Whether leased claims and completions are committed in groups.
    pub(crate) fn group_commit(&self) -> bool {
        self.inner.group_commit
    }

    /// The group commit runners' queues.
    pub(crate) fn groups(&self) -> &Groups {
        &self.inner.groups
    }

    /// A handle that does not keep the store open (for its own tasks).
    pub(crate) fn downgrade(&self) -> Weak<Inner> {
        Arc::downgrade(&self.inner)
    }

    /// The store behind `weak`, if a handle to it is still open.
    pub(crate) fn upgrade(weak: &Weak<Inner>) -> Option<PgStore> {
        weak.upgrade().map(|inner| PgStore { inner })
    }

    /// The connection pool, for the application's own queries.
    pub fn pool(&self) -> &PgPool {
        &self.inner.pool
    }

    /// Lease and retention settings.
    pub fn settings(&self) -> &Settings {
        &self.inner.settings
    }

    /// The clock every lease and retention time is read from.
    pub fn clock(&self) -> &SharedClock {
        &self.inner.clock
    }

    /// Maps a sqlx error (the only place a driver error becomes an Idem error).
    pub(crate) fn fail(&self, error: sqlx::Error) -> Error {
        let error = store_error(error, &self.inner.endpoint);
        self.notice(&error);
        Error::Store(error)
    }

    /// An effect failed with `error`: when it is a sqlx error that says the
    /// server went away or refuses writes (an effect's write is often the
    /// first to meet a read-only server), the server is looked for again,
    /// as for the store's own statements. Effects with errors of their own
    /// type are noticed when the caller asks
    /// [`effect_error_kind`](idem_core::AtomicStore::effect_error_kind).
    pub(crate) fn notice_effect<E: 'static>(&self, error: &E) {
        if self.inner.failover.is_some()
            && let Some(error) = (error as &dyn std::any::Any).downcast_ref::<sqlx::Error>()
        {
            let _ = self.kind_of_cause(error);
        }
    }

    /// Looks for the server to use again when `error` says the current one
    /// went away or refuses writes (with a multi-host URL or
    /// `target_session_attrs`; see `connect`).
    fn notice(&self, error: &StoreError) {
        if let Some(failover) = &self.inner.failover {
            failover.noticed(error.kind(), error);
        }
    }

    /// Opens a READ COMMITTED transaction on the store's pool, for the
    /// application's own writes next to the store's. Unlike `pool().begin()`,
    /// a caller given up while the `BEGIN` is on its way cannot leave the
    /// pooled connection inside a transaction that sqlx does not count (see
    /// `lock::begin`).
    pub async fn begin_transaction(&self) -> Result<Transaction<'static, Postgres>, Error> {
        self.begin().await
    }

    /// Whether an idle connection may be taken from the pool as it is
    /// (`try_acquire`, without sqlx's checks): not for a while after a
    /// failover, when it may still be one to the old server.
    pub(crate) fn idle_connections_trusted(&self) -> bool {
        self.inner
            .failover
            .as_ref()
            .is_none_or(|failover| !failover.recently_switched())
    }

    /// Opens a transaction for a locked read-then-write.
    pub(crate) async fn begin(&self) -> Result<Transaction<'static, Postgres>, Error> {
        lock::begin(self.pool(), self.pooling().begin())
            .await
            .map_err(|e| self.fail(e))
    }

    /// Commits.
    pub(crate) async fn commit(&self, tx: Transaction<'static, Postgres>) -> Result<(), Error> {
        tx.commit().await.map_err(|e| self.fail_commit(e))
    }

    /// Maps an error met while committing: a broken connection leaves the
    /// commit's fate unknown ([`ErrorKind::CommitUnknown`](idem_core::ErrorKind::CommitUnknown)).
    pub(crate) fn fail_commit(&self, error: sqlx::Error) -> Error {
        let error = commit_error(error, &self.inner.endpoint);
        self.notice(&error);
        Error::Store(error)
    }

    /// The kind of the sqlx error behind an effect's error, if there is one.
    pub(crate) fn kind_of_cause(
        &self,
        error: &(dyn std::error::Error + 'static),
    ) -> Option<idem_core::ErrorKind> {
        let kind = kind_of_cause(error, &self.inner.endpoint);
        if let (Some(failover), Some(kind)) = (&self.inner.failover, kind) {
            failover.noticed(kind, error);
        }
        kind
    }

    /// Rolls back now rather than when the connection is next used, so the key's
    /// lock is free by the time the caller hears the answer. A failed rollback
    /// is only logged: the server rolls back anyway when the connection goes.
    pub(crate) async fn roll_back(&self, tx: Transaction<'_, Postgres>) {
        if let Err(error) = tx.rollback().await {
            tracing::warn!(%error, "rollback failed; the connection is discarded");
        }
    }

    /// Runs `effect` on `tx`'s connection. When it fails or panics, `tx` is
    /// rolled back first, so the key's lock is free by the time the caller
    /// sees the error, and the error comes back (or the panic goes on).
    pub(crate) async fn run_or_roll_back<'t, F, T, E>(
        &self,
        mut tx: Transaction<'t, Postgres>,
        effect: F,
    ) -> Result<(Transaction<'t, Postgres>, T), E>
    where
        F: AtomicEffect<sqlx::PgConnection, T, E>,
        E: 'static,
    {
        let ran = AssertUnwindSafe(TxCall::call(effect, &mut *tx))
            .catch_unwind()
            .await;
        match ran {
            Ok(Ok(done)) => Ok((tx, done)),
            Ok(Err(error)) => {
                self.roll_back(tx).await;
                self.notice_effect(&error);
                Err(error)
            }
            Err(panic) => {
                self.roll_back(tx).await;
                std::panic::resume_unwind(panic);
            }
        }
    }

    /// Writes records read under the lock; a row that changed since it was read
    /// (which the lock should make impossible) fails the operation as a
    /// serialization failure, so nothing is committed on a stale decision.
    pub(crate) async fn write(
        &self,
        conn: &mut sqlx::PgConnection,
        written: &[idem_core::Record],
    ) -> Result<(), Error> {
        let count = records::write(conn, written)
            .await
            .map_err(|e| self.fail(e))?;
        if count == written.len() as u64 {
            return Ok(());
        }
        Err(self.changed_under_lock(written.len() as u64 - count, written.len()))
    }

    /// The failure of a write that found `changed` of its `of` records changed
    /// since they were read under their key's lock: a serialization failure, so
    /// the caller runs the operation again.
    pub(crate) fn changed_under_lock(&self, changed: u64, of: usize) -> Error {
        Error::Store(StoreError::new(
            ErrorKind::SerializationFailure,
            format!(
                "{changed} of {of} records changed in PostgreSQL at {} after they were read under their key's lock (a completion, which takes no lock, settled one meanwhile); run the operation again",
                self.inner.endpoint
            ),
        ))
    }

    /// The refusal for a claim whose token is no longer current, reported.
    pub(crate) fn fenced(&self, claim: &Claim, current: Option<FencingToken>) -> Error {
        let error = Error::Fenced {
            scope: claim.scope.clone(),
            key: claim.key.clone(),
            held: claim.token,
            current,
        };
        observe::refused(&error);
        error
    }
}

/// Sets up a [`PgStore`]: settings, clock, pool size, and whether to migrate.
pub struct PgStoreBuilder {
    url: String,
    settings: Settings,
    clock: SharedClock,
    max_connections: u32,
    acquire_timeout: Duration,
    migrate: bool,
    group_commit: bool,
}

impl fmt::Debug for PgStoreBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The URL may carry a password: show where it points, never the URL.
        let target = crate::hosts::take_hosts(&self.url)
            .ok()
            .and_then(|(url, hosts)| {
                let (url, _) = take_idem_params(&url).ok()?;
                let options = PgConnectOptions::from_str(&url).ok()?;
                let endpoint = Endpoint::new(&options, self.max_connections, self.acquire_timeout);
                Some(match hosts {
                    Some(list) if !list.hosts.is_empty() => endpoint.at(list.describe()),
                    _ => endpoint,
                })
            })
            .map(|endpoint| endpoint.to_string())
            .unwrap_or_else(|| "<URL not valid>".to_owned());
        f.debug_struct("PgStoreBuilder")
            .field("target", &target)
            .field("settings", &self.settings)
            .field("clock", &self.clock)
            .field("max_connections", &self.max_connections)
            .field("acquire_timeout", &self.acquire_timeout)
            .field("migrate", &self.migrate)
            .field("group_commit", &self.group_commit)
            .finish()
    }
}

impl PgStoreBuilder {
    /// Lease and retention settings (default: [`Settings::default`]).
    pub fn settings(mut self, settings: Settings) -> Self {
        self.settings = settings;
        self
    }

    /// The clock (default: the system clock). Tests pass a
    /// [`ManualClock`](idem_core::ManualClock).
    pub fn clock(mut self, clock: SharedClock) -> Self {
        self.clock = clock;
        self
    }

    /// The most connections the pool opens (default 16, at least 1).
    pub fn max_connections(mut self, max: u32) -> Self {
        self.max_connections = max.max(1);
        self
    }

    /// How long an operation waits for a pooled connection before failing as
    /// unavailable (default 5 s).
    pub fn acquire_timeout(mut self, timeout: Duration) -> Self {
        self.acquire_timeout = timeout;
        self
    }

    /// Whether [`connect`](Self::connect) creates or upgrades the schema
    /// (default `true`; safe from several processes at once).
    pub fn migrate(mut self, migrate: bool) -> Self {
        self.migrate = migrate;
        self
    }

    /// Whether the leased claims and completions of concurrent callers may
    /// share transactions (default `true`). Each caller still hears its own
    /// answer after the commit; a grouped claim still looks its key up on its
    /// own first, so replays never wait for a group. The calls that write then
    /// share a few transactions and flushes to disk instead of one each, at
    /// the price of a hop to the task that groups them. Which pays depends on
    /// the load and the server, so with `true` each call goes the way that
    /// has lately been faster: grouped, or alone, with one call in sixteen
    /// sent the other way to keep measuring it (the metric
    /// `store_group_calls_total` counts both). `false` gives every call a
    /// transaction of its own (a new key's claim in one round trip, or three
    /// where the one-statement claim is not used, a completion in one).
    pub fn group_commit(mut self, group: bool) -> Self {
        self.group_commit = group;
        self
    }

    /// Connects: checks the server answers (one connection, no retries, so an
    /// unreachable server is reported at once and with its real cause), migrates
    /// if asked, and opens the pool.
    ///
    /// The URL may end with `group_commit=off` (or `on`) among its query
    /// parameters, which sets [`group_commit`](Self::group_commit): a way to
    /// choose it where only a URL is given, as with `idem --store`.
    ///
    /// The URL may name several servers as libpq does
    /// (`postgres://user@host1:5432,host2:5432/db`, or
    /// `?host=host1,host2&port=5432,5432`) and say which to use with
    /// `target_session_attrs` (`any`, `read-write`, `read-only`, `primary`,
    /// `standby`, `prefer-standby`): they are tried in order, on every new
    /// connection, so that the pool follows a failover.
    ///
    /// Behind a transaction pooler (PgBouncer with `pool_mode = transaction`)
    /// the URL says `pgbouncer=true`: no prepared statement outlives its
    /// transaction, nothing is sent outside a transaction, the migrations'
    /// lock is transaction-scoped, nothing listens for notifications (waiters
    /// poll) and `extra_float_digits` is not sent at start-up.
    /// `statement_cache=0` asks for the statement choices alone.
    pub async fn connect(mut self) -> Result<PgStore, Error> {
        let (url, mut pooling, cache) = Pooling::take(&self.url)?;
        self.url = url;
        let (url, hosts) = crate::hosts::take_hosts(&self.url)?;
        let (url, params) = take_idem_params(&url)?;
        if let Some(group) = params.group_commit {
            self.group_commit = group;
        }
        check_files(&params.files)?;
        let options = PgConnectOptions::from_str(&url)
            .map(|options| pooling.apply(options, cache))
            .map_err(|e| {
            // Said without the URL itself, which may hold a password.
            Error::Store(StoreError::with_source(
                ErrorKind::Config,
                format!(
                    "the PostgreSQL URL is not valid: {e}; write it as postgres://user@host:port/database"
                ),
                e,
            ))
        })?;
        let mut endpoint = Endpoint::new(&options, self.max_connections, self.acquire_timeout);
        let failover = match hosts {
            None => None,
            Some(list) => {
                let servers = if list.hosts.is_empty() {
                    vec![options.clone()]
                } else {
                    list.servers(&options)
                };
                let servers = servers
                    .into_iter()
                    .map(|server| apply_passfile(server, &params))
                    .collect::<Result<Vec<_>, _>>()?;
                if !list.hosts.is_empty() {
                    endpoint = endpoint.at(list.describe());
                }
                Some(Arc::new(Failover::new(list, servers, self.acquire_timeout)))
            }
        };
        let mut options = apply_passfile(options, &params)?;
        let fail = |e| Error::Store(store_error(e, &endpoint));

        // A server behind a partition may accept the connection and never
        // answer: the first connection is bounded like any other acquire
        // (each server of a list is given that long).
        let mut first = match &failover {
            Some(failover) => failover.find().await.map_err(fail)?,
            None => {
                let (first, found) =
                    crate::pooler::connect_first(&options, pooling, self.acquire_timeout)
                        .await
                        .map_err(fail)?;
                if found != pooling {
                    pooling = found;
                    options = found.apply(options, cache);
                }
                first
            }
        };
        if self.migrate {
            // `run_direct` on the connection itself: `run(&mut conn)` goes through
            // `Acquire`, which makes this future not provably `Send`.
            crate::pooler::migrate_on(&mut first, pooling)
                .await
                .map_err(|e| fail(e.into()))?;
        }
        if let Err(error) = first.close().await {
            tracing::debug!(%error, "closing the start-up connection failed");
        }

        let checked = failover.clone();
        let mut pool = PgPoolOptions::new()
            .max_connections(self.max_connections)
            .acquire_timeout(self.acquire_timeout)
            .after_connect(move |conn, _| {
                let checked = checked.clone();
                Box::pin(async move {
                    if let Some(failover) = checked {
                        failover.check(conn).await?;
                    }
                    // Best effort: without the schema (`migrate(false)`) this
                    // fails, and apply prepares on first use instead.
                    // Through a pooler they are prepared by each
                    // transaction instead (see `pooler`).
                    if pooling.sessions()
                        && let Err(error) = records::prepare_session(conn).await
                    {
                        tracing::debug!(%error, "preparing apply's statements failed; they are prepared on first use");
                    }
                    Ok(())
                })
            });
        if let Some(failover) = failover.clone() {
            pool = pool.before_acquire(move |_, meta| {
                let fresh = failover.is_fresh(meta.age);
                Box::pin(async move { Ok(fresh) })
            });
        }
        let pool = pool.connect_lazy_with(match &failover {
            Some(failover) => failover.current_server(),
            None => options,
        });
        let store = PgStore::of(
            pool,
            self.settings,
            self.clock,
            endpoint,
            self.group_commit,
            failover.clone(),
        )
        .with_pooling(pooling);
        if let Some(failover) = &failover {
            failover.attach(store.downgrade());
        }
        Ok(store)
    }
}

/// The parameters of a store URL that Idem reads itself (sqlx does not know
/// them), taken out of the URL before sqlx parses it.
#[derive(Debug, Default, PartialEq, Eq)]
struct IdemParams {
    /// `group_commit=on|off`.
    group_commit: Option<bool>,
    /// `passfile=PATH`: libpq's password file, read when the URL and
    /// `PGPASSWORD` give no password.
    passfile: Option<String>,
    /// Whether the URL itself carries a password (`user:PASSWORD@` or
    /// `password=`).
    has_password: bool,
    /// The certificate and key files the URL names (`sslrootcert`,
    /// `sslcert`, `sslkey`), with the parameter that named each.
    files: Vec<(String, String)>,
}

/// The URL without the parameters only Idem reads, and those parameters.
fn take_idem_params(url: &str) -> Result<(String, IdemParams), Error> {
    let (base, query) = url.split_once('?').unwrap_or((url, ""));
    let mut params = IdemParams {
        has_password: base
            .split_once("://")
            .map(|(_, rest)| rest.split('/').next().unwrap_or(rest))
            .and_then(|authority| authority.rsplit_once('@'))
            .is_some_and(|(userinfo, _)| userinfo.contains(':')),
        ..IdemParams::default()
    };
    let mut kept = Vec::new();
    for pair in query.split('&').filter(|pair| !pair.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        match key {
            "group_commit" => {
                params.group_commit = Some(match value {
                    "on" | "true" => true,
                    "off" | "false" => false,
                    other => {
                        return Err(Error::Store(StoreError::new(
                            ErrorKind::Config,
                            format!(
                                "group_commit={other:?} in the PostgreSQL URL is not understood: write group_commit=on or group_commit=off"
                            ),
                        )));
                    }
                });
            }
            "passfile" => params.passfile = Some(percent_decoded(value)),
            _ => {
                match key {
                    "password" => params.has_password = true,
                    "sslrootcert" | "ssl-root-cert" | "ssl-ca" | "sslcert" | "ssl-cert"
                    | "sslkey" | "ssl-key" => {
                        params.files.push((key.to_owned(), percent_decoded(value)));
                    }
                    "sslmode"
                    | "ssl-mode"
                    | "statement-cache-capacity"
                    | "host"
                    | "hostaddr"
                    | "port"
                    | "dbname"
                    | "user"
                    | "application_name"
                    | "options" => {}
                    k if k.starts_with("options[") => {}
                    _ => {
                        // sqlx would ignore it too, but log its value, which
                        // may be a misspelt password.
                        tracing::warn!(
                            parameter = key,
                            "ignoring a parameter of the PostgreSQL URL that is not understood"
                        );
                        continue;
                    }
                }
                kept.push(pair);
            }
        }
    }
    let url = if kept.is_empty() {
        base.to_owned()
    } else {
        format!("{base}?{}", kept.join("&"))
    };
    Ok((url, params))
}

/// A query value with `%XX` and `+` decoded (as sqlx decodes it).
fn percent_decoded(value: &str) -> String {
    let bytes = value.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| char::from(b).to_digit(16);
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => match (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                (Some(high), Some(low)) => {
                    out.push(u8::try_from(high * 16 + low).unwrap_or(b'?'));
                    i += 3;
                    continue;
                }
                _ => out.push(b'%'),
            },
            b'+' => out.push(b' '),
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Refuses certificate and key files that cannot be read, before a
/// connection is tried: sqlx would report them as an I/O error, which reads
/// like an unreachable server.
fn check_files(files: &[(String, String)]) -> Result<(), Error> {
    for (param, path) in files {
        if path.starts_with("-----BEGIN") {
            continue;
        }
        if let Err(e) = std::fs::File::open(path) {
            return Err(Error::Store(StoreError::with_source(
                ErrorKind::Config,
                format!(
                    "{param}={path} in the PostgreSQL URL cannot be read: {e}; name a PEM file this process can read"
                ),
                e,
            )));
        }
    }
    Ok(())
}

/// Sets the password from `passfile` when nothing else gave one (libpq's
/// order: the URL, then `PGPASSWORD`, then the password file).
fn apply_passfile(
    options: PgConnectOptions,
    params: &IdemParams,
) -> Result<PgConnectOptions, Error> {
    let Some(path) = &params.passfile else {
        return Ok(options);
    };
    if params.has_password || std::env::var_os("PGPASSWORD").is_some() {
        return Ok(options);
    }
    let target = crate::passfile::Target {
        host: if options.get_socket().is_some() {
            "localhost"
        } else {
            options.get_host()
        },
        port: options.get_port(),
        database: options
            .get_database()
            .unwrap_or_else(|| options.get_username()),
        user: options.get_username(),
    };
    match crate::passfile::lookup(std::path::Path::new(path), target) {
        Ok(Some(password)) => Ok(options.password(&password)),
        Ok(None) => Ok(options),
        Err(e) => Err(Error::Store(StoreError::with_source(
            ErrorKind::Config,
            format!(
                "passfile={path} in the PostgreSQL URL cannot be read: {e}; name a password file (host:port:database:user:password lines) this process can read"
            ),
            e,
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn group_commit(url: &str) -> Result<(String, Option<bool>), Error> {
        take_idem_params(url).map(|(url, params)| (url, params.group_commit))
    }

    #[test]
    fn a_builder_shows_every_server_of_a_list_and_no_password() {
        let builder = PgStore::builder(
            "postgres://app:s3cret@db1:5432,db2:5433/orders?target_session_attrs=read-write",
        );
        let shown = format!("{builder:?}");
        assert!(
            shown.contains("db1:5432,db2:5433 (database orders, user app)"),
            "{shown}"
        );
        assert!(!shown.contains("s3cret"), "{shown}");
    }

    #[test]
    fn group_commit_is_read_from_the_url_and_removed_from_it() {
        let url = "postgres://u@h/db";
        assert_eq!(group_commit(url).unwrap(), (url.to_owned(), None));
        assert_eq!(
            group_commit("postgres://u@h/db?group_commit=off").unwrap(),
            ("postgres://u@h/db".to_owned(), Some(false))
        );
        assert_eq!(
            group_commit("postgres://u@h/db?sslmode=disable&group_commit=on&application_name=x")
                .unwrap(),
            (
                "postgres://u@h/db?sslmode=disable&application_name=x".to_owned(),
                Some(true)
            )
        );
        let err = group_commit("postgres://u@h/db?group_commit=maybe").unwrap_err();
        assert!(err.to_string().contains("group_commit=off"), "{err}");
    }

    #[test]
    fn passfile_is_taken_out_and_certificate_files_and_passwords_are_noticed() {
        let (url, params) = take_idem_params(
            "postgres://u@h/db?sslmode=verify-full&sslrootcert=%2Fetc%2Fca.pem&passfile=/home/u/.pg%20pass",
        )
        .unwrap();
        assert_eq!(
            url,
            "postgres://u@h/db?sslmode=verify-full&sslrootcert=%2Fetc%2Fca.pem"
        );
        assert_eq!(params.passfile.as_deref(), Some("/home/u/.pg pass"));
        assert_eq!(
            params.files,
            [("sslrootcert".to_owned(), "/etc/ca.pem".to_owned())]
        );
        assert!(!params.has_password);
        for url in [
            "postgres://u:pw@h/db",
            "postgres://u:pw@h:5432/db?passfile=x",
            "postgres://u@h/db?password=pw",
        ] {
            assert!(take_idem_params(url).unwrap().1.has_password, "{url}");
        }
        assert!(!take_idem_params("postgres://h/db").unwrap().1.has_password);
        // Not understood: dropped here, so that sqlx does not log its value.
        let (url, _) =
            take_idem_params("postgres://u@h/db?pasword=hunter2&sslmode=require").unwrap();
        assert_eq!(url, "postgres://u@h/db?sslmode=require");
    }

    #[test]
    fn an_unreadable_certificate_file_is_a_config_error_that_names_it() {
        let files = [(
            "sslrootcert".to_owned(),
            "/nonexistent/idem-ca.pem".to_owned(),
        )];
        let err = check_files(&files).unwrap_err();
        assert!(
            matches!(&err, Error::Store(e) if e.kind() == ErrorKind::Config),
            "{err:?}"
        );
        assert!(
            err.to_string()
                .contains("sslrootcert=/nonexistent/idem-ca.pem"),
            "{err}"
        );
    }
}
