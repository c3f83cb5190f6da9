//! HTTP: the client that reaches an endpoint over plain HTTP or TLS
//! (rustls, *ring*), with the roots and client certificate given or
//! webpki's bundled roots; the webhook publisher (`publish`) and the sidecar
//! that forwards consumed messages ([`crate::forward`]) both call through it.
//! The whole folder needs the `webhook` feature.

pub(crate) mod publish;

use bytes::Bytes;
use http_body_util::Full;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

/// A client that posts whole bodies, over plain HTTP or TLS.
pub(crate) type HttpClient = Client<HttpsConnector<HttpConnector>, Full<Bytes>>;

/// A client for `http://` and `https://` URLs; `https://` is checked against
/// `tls` (its roots, a client certificate), or webpki's bundled roots.
/// Connections are opened per call and kept alive between calls.
pub(crate) fn client(tls: Option<&rustls::ClientConfig>) -> HttpClient {
    let builder = hyper_rustls::HttpsConnectorBuilder::new();
    let builder = match tls {
        Some(tls) => builder.with_tls_config(tls.clone()),
        None => builder.with_webpki_roots(),
    };
    Client::builder(TokioExecutor::new()).build(builder.https_or_http().enable_http1().build())
}
