//! [`IdempotencyLayer`]: holds the store and the configuration, and wraps
//! services in [`IdempotencyService`].

use std::fmt;
use std::sync::Arc;

use idem_core::LeaseStore;
use tower::Layer;

use super::cache::AnswerCache;
use super::wait::Waiters;
use super::{Answers, IdempotencyConfig, IdempotencyService, Reconcile, Shared, Spool, SpoolError};

/// Puts `Idempotency-Key` semantics in front of a service, with any
/// [`LeaseStore`] keeping the records.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use axum::{Router, routing::post};
/// use idem_http::{IdempotencyConfig, IdempotencyLayer};
///
/// let dir = tempfile::tempdir()?;
/// let config = IdempotencyConfig::default();
/// let store = idem::SqliteStore::builder(dir.path().join("idem.db"))
///     .settings(config.store_settings())
///     .open()
///     .await?;
/// let layer = IdempotencyLayer::new(store, config);
/// let app: Router = Router::new()
///     .route("/orders", post(|| async { "created" }))
///     .layer(layer);
/// # drop(app); Ok(()) }
/// ```
pub struct IdempotencyLayer<St> {
    shared: Arc<Shared<St>>,
}

impl<St: LeaseStore> IdempotencyLayer<St> {
    /// A layer over `store`. The store's own lease and retention apply; open it
    /// with [`IdempotencyConfig::store_settings`] so that they match the config
    /// (the layer renews claims every third of the config's lease).
    pub fn new(store: St, config: IdempotencyConfig) -> Self {
        Self {
            shared: Arc::new(Shared {
                store: Arc::new(store),
                waiters: Arc::new(Waiters::new(config.waiter_caps)),
                cache: Arc::new(AnswerCache::new(config.replay_cache)),
                held: Arc::default(),
                config,
                answers: Answers::default(),
            }),
        }
    }

    /// The same layer (the same store and config) with other `answers`.
    fn with_answers(self, change: impl FnOnce(&mut Answers)) -> Self {
        let mut answers = self.shared.answers.clone();
        change(&mut answers);
        Self {
            shared: Arc::new(Shared {
                store: Arc::clone(&self.shared.store),
                config: self.shared.config.clone(),
                answers,
                waiters: Arc::clone(&self.shared.waiters),
                cache: Arc::clone(&self.shared.cache),
                held: Arc::clone(&self.shared.held),
            }),
        }
    }

    /// Keeps answers the store cannot take yet in `spool` (synced before the
    /// answer is sent) as well as in memory, so they are stored even if this
    /// process stops first: call [`flush_spool`](Self::flush_spool) at the
    /// next start, before serving. Without a spool such answers are retried
    /// in memory only.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use idem_http::{IdempotencyConfig, IdempotencyLayer, Spool};
    ///
    /// let dir = tempfile::tempdir()?;
    /// let store = idem::SqliteStore::open(dir.path().join("idem.db")).await?;
    /// let layer = IdempotencyLayer::new(store, IdempotencyConfig::default())
    ///     .with_spool(Spool::open(dir.path().join("idem.spool"))?);
    /// assert_eq!(layer.flush_spool().await?, 0, "nothing left from an earlier run");
    /// # Ok(()) }
    /// ```
    pub fn with_spool(self, spool: Spool) -> Self {
        self.with_answers(|answers| answers.spool = Some(spool))
    }

    /// Asks `reconcile` before running a request whose claim took over an
    /// expired one (an earlier attempt with an unknown outcome); see
    /// [`Reconcile`].
    pub fn with_reconcile(self, reconcile: impl Reconcile) -> Self {
        self.with_answers(|answers| answers.reconcile = Some(Arc::new(reconcile)))
    }

    /// The spool, if the layer has one.
    pub fn spool(&self) -> Option<&Spool> {
        self.shared.answers.spool.as_ref()
    }

    /// Stores the answers an earlier run left in the spool, each fenced by
    /// its claim's token (one taken over meanwhile is dropped and logged),
    /// and marks them done. Waits while the store cannot be reached. Returns
    /// how many were stored; 0 without a spool.
    pub async fn flush_spool(&self) -> Result<usize, SpoolError> {
        match &self.shared.answers.spool {
            Some(spool) => {
                super::keep::flush(&*self.shared.store, spool, self.shared.config.lease).await
            }
            None => Ok(0),
        }
    }

    /// How many concurrent duplicates wait for their original in this
    /// process now ([`Concurrent::Wait`](crate::Concurrent::Wait)).
    pub fn waiting(&self) -> usize {
        self.shared.waiters.waiting()
    }

    /// The store.
    pub fn store(&self) -> &St {
        &self.shared.store
    }

    /// The configuration.
    pub fn config(&self) -> &IdempotencyConfig {
        &self.shared.config
    }
}

#[cfg(any(
    feature = "sqlite",
    feature = "postgres",
    feature = "redis",
    feature = "dynamodb"
))]
#[cfg_attr(
    docsrs,
    doc(cfg(any(
        feature = "sqlite",
        feature = "postgres",
        feature = "redis",
        feature = "dynamodb"
    )))
)]
impl IdempotencyLayer<idem::AnyStore> {
    /// Opens the store at `location` (`sqlite://PATH`, `postgres://URL`,
    /// `redis://HOST:PORT/DB` or `dynamodb:///TABLE`, as the crate features
    /// allow) with the config's lease and retention, and makes a layer over
    /// it.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use idem_http::{IdempotencyConfig, IdempotencyLayer};
    ///
    /// let dir = tempfile::tempdir()?;
    /// let location = format!("sqlite://{}", dir.path().join("idem.db").display()).parse()?;
    /// let layer = IdempotencyLayer::open(&location, IdempotencyConfig::default()).await?;
    /// # drop(layer); Ok(()) }
    /// ```
    pub async fn open(
        location: &idem::StoreLocation,
        config: IdempotencyConfig,
    ) -> Result<Self, idem_core::Error> {
        let store = idem::AnyStore::open_with(
            location,
            config.store_settings(),
            Arc::new(idem_core::SystemClock),
        )
        .await?;
        Ok(Self::new(store, config))
    }
}

impl<St> Clone for IdempotencyLayer<St> {
    fn clone(&self) -> Self {
        Self {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<St> fmt::Debug for IdempotencyLayer<St> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyLayer")
            .field("config", &self.shared.config)
            .field("spool", &self.shared.answers.spool)
            .field("reconciles", &self.shared.answers.reconcile.is_some())
            .finish_non_exhaustive()
    }
}

impl<S, St> Layer<S> for IdempotencyLayer<St> {
    type Service = IdempotencyService<S, St>;

    fn layer(&self, inner: S) -> Self::Service {
        IdempotencyService {
            inner,
            shared: Arc::clone(&self.shared),
        }
    }
}
