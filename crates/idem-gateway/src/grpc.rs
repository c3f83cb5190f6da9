//! The gRPC guard of `idem serve`: [`GrpcIdempotencyLayer`] over the
//! gateway's forwarding service, so gRPC services in any language get keyed
//! unary calls through the gateway (see [`Gateway::with_grpc`]); with a
//! probe ([`Gateway::with_grpc_probing`]), a lookup method of the upstream is
//! asked (through the same forwarding) before a call whose outcome is unknown
//! runs again.
//!
//! [`Gateway::with_grpc`]: crate::Gateway::with_grpc
//! [`Gateway::with_grpc_probing`]: crate::Gateway::with_grpc_probing

use std::sync::Arc;
use std::time::Duration;

use crate::{Forward, GrpcGuard};
use axum::body::Body;
use idem::LeaseStore;
use tower::{Layer, ServiceExt};

use idem_grpc::{GrpcIdempotencyLayer, GrpcProbe, ProbeMethod};

/// The guard [`Gateway::with_grpc`](crate::Gateway::with_grpc) installs:
/// `layer` over the gateway's forwarding service. A keyed call to one of the
/// layer's unary methods is claimed, forwarded, and its answer stored with
/// its trailers; when the upstream's outcome is unknown (a timeout, a broken
/// connection after the call was sent) the key stays reserved until its
/// lease ends, as on the HTTP side.
pub(crate) fn guard<St: LeaseStore + 'static>(layer: GrpcIdempotencyLayer<St>) -> GrpcGuard {
    Arc::new(move |forward: Forward| guarded(&layer, forward))
}

/// [`guard`], with `probe`'s lookup methods of the upstream asked (through
/// the gateway's forwarding, with the retry's metadata and message; see
/// [`ProbeMethod`]) before a call whose outcome is unknown runs again, each
/// lookup awaited at most `timeout`. An unknown outcome then ends its
/// claim's lease at once instead of holding the key for the lease.
pub(crate) fn guard_probing<St: LeaseStore + 'static>(
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
        |response: idem_grpc::GrpcResponse| response.map(Body::new),
    );
    Forward::new(guarded)
}
