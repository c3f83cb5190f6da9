//! The gRPC guard of `idem serve`: [`GrpcIdempotencyLayer`] over the
//! gateway's forwarding service, so gRPC services in any language get keyed
//! unary calls through the gateway; with [`guard_probing`], a lookup method
//! of the upstream is asked (through the same forwarding) before a call
//! whose outcome is unknown runs again.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use idem_grpc::{GrpcIdempotencyConfig, GrpcIdempotencyLayer};
//! use idem_http::gateway::{Gateway, GatewayConfig};
//! use idem_http::{IdempotencyConfig, IdempotencyLayer};
//!
//! let layer = IdempotencyLayer::open(&"sqlite://idem.db".parse()?, IdempotencyConfig::default()).await?;
//! let grpc = GrpcIdempotencyLayer::new(
//!     layer.store().clone(),
//!     GrpcIdempotencyConfig::default().unary("/payments.v1.Payments/Charge"),
//! );
//! let gateway = Gateway::new(layer, GatewayConfig::new("h2c://127.0.0.1:50051".parse()?))
//!     .with_grpc(idem_grpc::gateway::guard(grpc));
//! # Ok(()) }
//! ```

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use idem::LeaseStore;
use idem_http::gateway::{Forward, GrpcGuard};
use tower::{Layer, ServiceExt};

use crate::{GrpcIdempotencyLayer, GrpcProbe, ProbeMethod};

/// The guard to hand to [`Gateway::with_grpc`](idem_http::gateway::Gateway::with_grpc):
/// `layer` over the gateway's forwarding service. A keyed call to one of the
/// layer's unary methods is claimed, forwarded, and its answer stored with
/// its trailers; when the upstream's outcome is unknown (a timeout, a broken
/// connection after the call was sent) the key stays reserved until its
/// lease ends, as on the HTTP side.
pub fn guard<St: LeaseStore + 'static>(layer: GrpcIdempotencyLayer<St>) -> GrpcGuard {
    Arc::new(move |forward: Forward| guarded(&layer, forward))
}

/// [`guard`], with `probe`'s lookup methods of the upstream asked (through
/// the gateway's forwarding, with the retry's metadata and message; see
/// [`ProbeMethod`]) before a call whose outcome is unknown runs again, each
/// lookup awaited at most `timeout`. An unknown outcome then ends its
/// claim's lease at once instead of holding the key for the lease.
pub fn guard_probing<St: LeaseStore + 'static>(
    layer: GrpcIdempotencyLayer<St>,
    probe: GrpcProbe,
    timeout: Duration,
) -> GrpcGuard {
    Arc::new(move |forward: Forward| {
        let asked = ProbeMethod::new(probe.clone(), to_upstream(forward.clone())).timeout(timeout);
        guarded(&layer.clone().with_reconcile(asked), forward)
    })
}

/// The forwarding service over tonic's body.
fn to_upstream(
    forward: Forward,
) -> impl tower::Service<
    http::Request<tonic::body::Body>,
    Response = http::Response<Body>,
    Error = std::convert::Infallible,
    Future = impl Send,
> + Clone
+ Send
+ 'static {
    tower::service_fn(move |request: http::Request<tonic::body::Body>| {
        forward.clone().oneshot(request.map(Body::new))
    })
}

/// `layer` over `forward`.
fn guarded<St: LeaseStore + 'static>(
    layer: &GrpcIdempotencyLayer<St>,
    forward: Forward,
) -> Forward {
    let guarded = ServiceExt::<http::Request<Body>>::map_response(
        layer.layer(to_upstream(forward)),
        |response: crate::GrpcResponse| response.map(Body::new),
    );
    Forward::new(guarded)
}
