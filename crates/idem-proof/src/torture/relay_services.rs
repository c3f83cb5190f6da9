//! The relay scenarios' services: an application that answers each request
//! by enqueueing a message in the same transaction as its idempotency
//! record, for `idem relay` to publish; and a downstream service that
//! applies each message once per key, in the same transaction as its own
//! record. Killing the relay between a publish and marking the row sent
//! makes it publish the row again; the downstream must apply it once.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::Router;
use axum::http::StatusCode;
use axum::routing::post_service;
use idem::{AtomicOutbox, AtomicStore, PgStore, RecordStore, SqliteStore};
use idem_broker::outbox::{Outbox, OutboxStore, Route};
use idem_broker::publish::Message;
use idem_http::atomic::{self, AtomicRequest, HandlerResult};
use idem_http::{IdempotencyConfig, KeyRequirement, StoredResponse};
use tokio::task::JoinHandle;

/// The downstream's effect log.
pub(super) const EFFECTS_QUERY: &str = "SELECT key FROM effects ORDER BY seq";

/// A service on a loopback port; stops when dropped.
#[derive(Debug)]
pub(super) struct Service {
    pub addr: SocketAddr,
    server: JoinHandle<()>,
}

impl Drop for Service {
    fn drop(&mut self) {
        self.server.abort();
    }
}

async fn serve(app: Router) -> anyhow::Result<Service> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let server = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok(Service { addr, server })
}

fn required_key() -> IdempotencyConfig {
    IdempotencyConfig::default().require_key(KeyRequirement::Always)
}

/// The application: `POST /pay` enqueues a message keyed by the request's
/// key for the relay's default destination.
pub(super) async fn application<S>(store: &S) -> anyhow::Result<Service>
where
    S: AtomicOutbox + RecordStore + Clone + Send + Sync + 'static,
{
    idem_broker::outbox::migrate(store).await?;
    let outbox = Outbox::of(store);
    let route = atomic::route(
        store.clone(),
        required_key(),
        move |request: AtomicRequest| {
            async move |tx| -> HandlerResult {
                // The route requires a key: a request without one never gets here.
                let Some(key) = request.key().cloned() else {
                    return Ok(StoredResponse::text(StatusCode::BAD_REQUEST, "no key"));
                };
                let message = Message::new(key.clone(), request.body().to_vec());
                outbox.enqueue(tx, Route::Default, &message).await?;
                Ok(StoredResponse::text(
                    StatusCode::CREATED,
                    format!("queued {}", key.as_str()),
                ))
            }
        },
    );
    serve(Router::new().route("/pay", post_service(route))).await
}

/// The downstream: `POST /deliver` writes one row of `effects` per key, in
/// the transaction of its idempotency record; `deliveries` counts every
/// request it received.
pub(super) async fn downstream(
    store: &SqliteStore,
    deliveries: Arc<AtomicUsize>,
) -> anyhow::Result<Service> {
    store
        .transaction(async |tx| -> idem::rusqlite::Result<()> {
            tx.execute_batch("CREATE TABLE effects (seq INTEGER PRIMARY KEY, key TEXT NOT NULL)")
        })
        .await?;
    let route = atomic::route(
        store.clone(),
        required_key(),
        move |request: AtomicRequest| {
            deliveries.fetch_add(1, Ordering::SeqCst);
            async move |tx| -> HandlerResult {
                // The route requires a key: a request without one never gets here.
                let Some(key) = request.key().cloned() else {
                    return Ok(StoredResponse::text(StatusCode::BAD_REQUEST, "no key"));
                };
                tx.execute("INSERT INTO effects (key) VALUES (?1)", [key.as_str()])?;
                Ok(StoredResponse::text(StatusCode::OK, "applied"))
            }
        },
    );
    serve(Router::new().route("/deliver", post_service(route))).await
}

/// The downstream of the chain on PostgreSQL: as [`downstream`], its
/// effects and records in a PostgreSQL database.
pub(super) async fn downstream_postgres(
    store: &PgStore,
    deliveries: Arc<AtomicUsize>,
) -> anyhow::Result<Service> {
    idem::sqlx::raw_sql("CREATE TABLE effects (seq bigserial PRIMARY KEY, key text NOT NULL)")
        .execute(store.pool())
        .await?;
    let route = atomic::route(
        store.clone(),
        required_key(),
        move |request: AtomicRequest| {
            deliveries.fetch_add(1, Ordering::SeqCst);
            async move |tx| -> HandlerResult {
                // The route requires a key: a request without one never gets here.
                let Some(key) = request.key().cloned() else {
                    return Ok(StoredResponse::text(StatusCode::BAD_REQUEST, "no key"));
                };
                idem::sqlx::query("INSERT INTO effects (key) VALUES ($1)")
                    .bind(key.as_str())
                    .execute(&mut *tx)
                    .await?;
                Ok(StoredResponse::text(StatusCode::OK, "applied"))
            }
        },
    );
    serve(Router::new().route("/deliver", post_service(route))).await
}

/// Rows not yet published.
pub(super) async fn pending<S: OutboxStore>(store: &S) -> anyhow::Result<u64> {
    Ok(store.outbox_stats().await?.pending)
}
