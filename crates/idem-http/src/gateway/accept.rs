//! The accept loop of a proxy process (the gateway, the duplicate-injection
//! proxy): HTTP/1 connections served until the shutdown signal, then a
//! graceful shutdown that waits at most a grace period for the requests in
//! flight.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use axum::response::Response;
use http::Request;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;

/// Serves every connection accepted on `listener` with `answer` (called with
/// each request and its client's address) until `shutdown` completes; then
/// stops accepting, lets the requests in flight finish, closes idle
/// connections, and returns `false` when some were still running after
/// `grace` (they are abandoned).
pub async fn serve_connections<F, Fut>(
    listener: TcpListener,
    shutdown: impl Future<Output = ()>,
    grace: Duration,
    answer: F,
) -> bool
where
    F: Fn(Request<Incoming>, SocketAddr) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = Result<Response, Infallible>> + Send + 'static,
{
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new());
    let graceful = GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    // Out of file descriptors and the like: wait, do not spin or die.
                    tracing::warn!(%error, "could not accept a connection");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        if let Err(error) = stream.set_nodelay(true) {
            tracing::debug!(%error, "could not set TCP_NODELAY");
        }
        let answer = answer.clone();
        let per_request = service_fn(move |request: Request<Incoming>| answer(request, peer));
        let connection = graceful.watch(http.serve_connection(TokioIo::new(stream), per_request));
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::debug!(%error, %peer, "connection ended with an error");
            }
        });
    }
    drop(listener);
    tracing::info!(
        ?grace,
        "stopped accepting; letting the requests in flight finish"
    );
    tokio::time::timeout(grace, graceful.shutdown())
        .await
        .is_ok()
}
