//! The accept loop of a proxy process (the gateway, the duplicate-injection
//! proxy): connections served until the shutdown signal, then a graceful
//! shutdown that waits at most a grace period for the requests in flight.
//!
//! One port speaks both HTTP/1.1 and HTTP/2: a connection that opens with
//! HTTP/2's preface (prior-knowledge h2c, or h2 after TLS's ALPN) is served
//! as HTTP/2, any other as HTTP/1.1.
//!
//! An HTTP/1.1 client has a bounded time to send each request's head (30 s,
//! or the gateway's body timeout): a connection that trickles its headers,
//! or sits idle between requests longer than that, is closed.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::response::Response;
use http::Request;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use super::tls::subject_of;

/// Who is at the other end of a connection, for each of its requests.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Peer {
    /// The client's address.
    pub addr: SocketAddr,
    /// Whether the connection is TLS.
    pub tls: bool,
    /// The subject (CN) of the client certificate the TLS handshake
    /// verified, if the client showed one.
    pub subject: Option<Arc<str>>,
}

/// How long a client may take over its TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// How long an HTTP/1.1 client may take to send a request's head, unless
/// told otherwise.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);

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
    serve_connections_over(
        listener,
        None,
        shutdown,
        grace,
        move |request, peer: Arc<Peer>| answer(request, peer.addr),
    )
    .await
}

/// [`serve_connections`], over TLS when `tls` is given: each connection's
/// handshake runs in the connection's own task (a slow one holds up no
/// other), and `answer` is told who the [`Peer`] is, its verified client
/// certificate's subject included.
pub async fn serve_connections_over<F, Fut>(
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    shutdown: impl Future<Output = ()>,
    grace: Duration,
    answer: F,
) -> bool
where
    F: Fn(Request<Incoming>, Arc<Peer>) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = Result<Response, Infallible>> + Send + 'static,
{
    serve_within(listener, tls, shutdown, grace, HEADER_READ_TIMEOUT, answer).await
}

/// [`serve_connections_over`], giving HTTP/1.1 clients `header_timeout` to
/// send each request's head.
pub(crate) async fn serve_within<F, Fut>(
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    shutdown: impl Future<Output = ()>,
    grace: Duration,
    header_timeout: Duration,
    answer: F,
) -> bool
where
    F: Fn(Request<Incoming>, Arc<Peer>) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = Result<Response, Infallible>> + Send + 'static,
{
    let mut http = auto::Builder::new(TokioExecutor::new());
    http.http1()
        .timer(TokioTimer::new())
        .header_read_timeout(header_timeout);
    http.http2().timer(TokioTimer::new());
    let graceful = GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        let (stream, addr) = tokio::select! {
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
        match &tls {
            None => {
                let peer = Arc::new(Peer {
                    addr,
                    tls: false,
                    subject: None,
                });
                let per_request = service_fn(move |request: Request<Incoming>| {
                    answer(request, Arc::clone(&peer))
                });
                let watcher = graceful.watcher();
                let http = http.clone();
                tokio::spawn(async move {
                    let connection =
                        watcher.watch(http.serve_connection(TokioIo::new(stream), per_request));
                    if let Err(error) = connection.await {
                        tracing::debug!(%error, peer = %addr, "connection ended with an error");
                    }
                });
            }
            Some(acceptor) => {
                let handshake = acceptor.accept(stream);
                let watcher = graceful.watcher();
                let http = http.clone();
                tokio::spawn(async move {
                    let stream = match tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake).await {
                        Ok(Ok(stream)) => stream,
                        Ok(Err(error)) => {
                            tracing::debug!(%error, peer = %addr, "TLS handshake failed");
                            return;
                        }
                        Err(_) => {
                            tracing::debug!(peer = %addr, "TLS handshake timed out");
                            return;
                        }
                    };
                    let subject = stream
                        .get_ref()
                        .1
                        .peer_certificates()
                        .and_then(<[_]>::first)
                        .and_then(subject_of)
                        .map(Arc::from);
                    let peer = Arc::new(Peer {
                        addr,
                        tls: true,
                        subject,
                    });
                    let per_request = service_fn(move |request: Request<Incoming>| {
                        answer(request, Arc::clone(&peer))
                    });
                    let connection =
                        watcher.watch(http.serve_connection(TokioIo::new(stream), per_request));
                    if let Err(error) = connection.await {
                        tracing::debug!(%error, peer = %addr, "connection ended with an error");
                    }
                });
            }
        }
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
