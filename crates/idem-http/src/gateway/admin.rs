//! The admin listener: `/metrics` in the Prometheus text format and
//! `/healthz`, on an address of its own so neither is reachable through the
//! proxy.
//!
//! Metrics go through the `metrics` facade; [`metrics_recorder`] installs the
//! Prometheus recorder once per process and hands out its handle. The record
//! gauges are refreshed from [`RecordStore::count`] on every scrape.

use std::future::Future;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use idem::{IdempotencyKey, LeaseStore, RecordStore, Scope};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tokio::net::TcpListener;

use super::observe;
use crate::IdempotencyLayer;

/// The Prometheus recorder could not be installed.
#[derive(Debug, thiserror::Error)]
#[error(
    "cannot install the Prometheus metrics recorder (is another metrics recorder installed in this process?): {0}"
)]
pub struct RecorderError(String);

static HANDLE: Mutex<Option<PrometheusHandle>> = Mutex::new(None);

/// Installs the Prometheus recorder as the process's global `metrics`
/// recorder the first time it is called, and returns its handle (the same one
/// on every call). Call it before serving, so no count is lost.
pub fn metrics_recorder() -> Result<PrometheusHandle, RecorderError> {
    let mut handle = HANDLE
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(handle) = handle.as_ref() {
        return Ok(handle.clone());
    }
    let installed = PrometheusBuilder::new()
        .install_recorder()
        .map_err(|e| RecorderError(e.to_string()))?;
    *handle = Some(installed.clone());
    Ok(installed)
}

struct Admin<St> {
    layer: IdempotencyLayer<St>,
    metrics: PrometheusHandle,
}

/// Serves `/metrics` and `/healthz` on `listener` until `shutdown` completes.
///
/// `/healthz` answers `200 ok` while the store answers a point lookup, `503`
/// with the store's error otherwise.
pub async fn serve_admin<St>(
    listener: TcpListener,
    layer: IdempotencyLayer<St>,
    metrics: PrometheusHandle,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()>
where
    St: LeaseStore + RecordStore + 'static,
{
    let admin = Arc::new(Admin { layer, metrics });
    let app = Router::new()
        .route("/metrics", get(scrape::<St>))
        .route("/healthz", get(health::<St>))
        .with_state(admin);
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
}

async fn scrape<St: LeaseStore + RecordStore>(
    State(admin): State<Arc<Admin<St>>>,
) -> impl IntoResponse {
    match admin.layer.store().count().await {
        Ok(count) => observe::records(count),
        Err(error) => tracing::warn!(%error, "could not count the stored records for /metrics"),
    }
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        admin.metrics.render(),
    )
}

async fn health<St: LeaseStore + RecordStore>(
    State(admin): State<Arc<Admin<St>>>,
) -> impl IntoResponse {
    let scope = Scope::new("healthz").expect("a valid scope");
    let key = IdempotencyKey::new("healthz").expect("a valid key");
    match admin.layer.store().get(&scope, &key).await {
        Ok(_) => (StatusCode::OK, "ok\n".to_owned()),
        Err(error) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("the idempotency store does not answer: {error}\n"),
        ),
    }
}
