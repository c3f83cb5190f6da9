//! [`IdempotencyLayer`]: holds the store and the configuration, and wraps
//! services in [`IdempotencyService`].

use std::fmt;
use std::sync::Arc;

use idem::{AnyStore, Error, LeaseStore, StoreLocation, SystemClock};
use tower::Layer;

use super::{IdempotencyConfig, IdempotencyService, Shared};

/// Puts `Idempotency-Key` semantics in front of a service, with any
/// [`LeaseStore`] keeping the records.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use axum::{Router, routing::post};
/// use idem_http::{IdempotencyConfig, IdempotencyLayer};
///
/// let dir = tempfile::tempdir()?;
/// let location = format!("sqlite://{}", dir.path().join("idem.db").display()).parse()?;
/// let layer = IdempotencyLayer::open(&location, IdempotencyConfig::default()).await?;
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
            shared: Arc::new(Shared { store, config }),
        }
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

impl IdempotencyLayer<AnyStore> {
    /// Opens the store at `location` (`sqlite://PATH` or `postgres://URL`) with
    /// the config's lease and retention, and makes a layer over it.
    pub async fn open(location: &StoreLocation, config: IdempotencyConfig) -> Result<Self, Error> {
        let store =
            AnyStore::open_with(location, config.store_settings(), Arc::new(SystemClock)).await?;
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
