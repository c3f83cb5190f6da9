//! W3C trace context in and out of header maps: [`continue_trace`] makes a
//! span continue the trace a request or message came with, and
//! [`inject_current`] writes the current span's context into the headers of
//! what is sent on.
//!
//! Why not the global propagator: the context is stored (in outbox rows, in
//! messages waiting on a broker) and read back by another process, maybe a
//! different program. The format is the W3C one, always; an application's
//! own choice of propagator for its HTTP calls does not change what is in a
//! stored row.

use std::collections::BTreeMap;

use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::TraceContextExt;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt;

pub use opentelemetry_http::{HeaderExtractor as HttpHeaders, HeaderInjector as HttpHeadersMut};

/// The W3C header that carries the trace id and the parent span id.
pub const TRACEPARENT: &str = "traceparent";
/// The W3C header that carries vendor-specific trace state.
pub const TRACESTATE: &str = "tracestate";

/// Makes `span` a child of the span whose context `carrier` holds (a
/// `traceparent` header), so a retried request, a republished row or a
/// redelivered message joins the trace of its first attempt.
///
/// Call it right after creating `span`, before entering it. The context is
/// left alone when the carrier has none, when there is no OpenTelemetry layer,
/// and when the current span is already in that trace (an outer layer, such
/// as the gateway's, continued it first: `span` stays its child). Returns
/// whether the parent was set.
///
/// ```
/// use std::collections::BTreeMap;
/// use idem_trace::{Headers, continue_trace};
///
/// let mut headers = BTreeMap::new();
/// headers.insert(
///     "traceparent".to_owned(),
///     "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".to_owned(),
/// );
/// let span = tracing::info_span!("consume");
/// // Without a tracing-opentelemetry layer installed there is nothing to set.
/// assert!(!continue_trace(&span, &Headers(&headers)));
/// ```
pub fn continue_trace(span: &Span, carrier: &dyn Extractor) -> bool {
    let parent = TraceContextPropagator::new().extract(carrier);
    let remote = parent.span().span_context().clone();
    if !remote.is_valid() {
        return false;
    }
    let current = Span::current().context();
    let here = current.span().span_context().clone();
    if here.is_valid() && here.trace_id() == remote.trace_id() {
        return false;
    }
    span.set_parent(parent).is_ok()
}

/// Writes the current span's context (`traceparent`, and `tracestate` when
/// there is one) into `carrier`, replacing what was there. Writes nothing,
/// and returns `false`, when the current span has no OpenTelemetry context:
/// then a context that came in is passed on as it is.
///
/// ```
/// use std::collections::BTreeMap;
/// use idem_trace::{HeadersMut, inject_current};
///
/// let mut headers = BTreeMap::new();
/// // No tracing-opentelemetry layer here: nothing to write.
/// assert!(!inject_current(&mut HeadersMut(&mut headers)));
/// assert!(headers.is_empty());
/// ```
pub fn inject_current(carrier: &mut dyn Injector) -> bool {
    let context = Span::current().context();
    if !context.span().span_context().is_valid() {
        return false;
    }
    TraceContextPropagator::new().inject_context(&context, carrier);
    true
}

/// Passes the trace on from what came in to what goes out: the current
/// span's context when it has one (see [`inject_current`]), else the
/// `traceparent` and `tracestate` of `from` as they are, so a hop without an
/// OpenTelemetry layer does not break the trace it is part of.
pub fn pass_on(from: &dyn Extractor, to: &mut dyn Injector) {
    if inject_current(to) {
        return;
    }
    for name in [TRACEPARENT, TRACESTATE] {
        if let Some(value) = from.get(name) {
            to.set(name, value.to_owned());
        }
    }
}

/// [`inject_current`] into `headers` unless they already carry a
/// `traceparent` (in any case): the caller's own context wins. Returns
/// whether a context was written.
pub fn inject_current_if_absent(headers: &mut BTreeMap<String, String>) -> bool {
    if Headers(headers).get(TRACEPARENT).is_some() {
        return false;
    }
    inject_current(&mut HeadersMut(headers))
}

/// A header map with text values (an outbox row's, a broker message's) read
/// as a carrier. Names are matched without regard to case: AMQP header names
/// are case-sensitive, NATS and HTTP ones are not, and publishers disagree.
#[derive(Debug, Clone, Copy)]
pub struct Headers<'a>(pub &'a BTreeMap<String, String>);

impl Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0
            .get(key)
            .or_else(|| {
                self.0
                    .iter()
                    .find(|(name, _)| name.eq_ignore_ascii_case(key))
                    .map(|(_, value)| value)
            })
            .map(String::as_str)
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(String::as_str).collect()
    }
}

/// A header map with text values written as a carrier: a header set here
/// replaces any of the same name in another case.
#[derive(Debug)]
pub struct HeadersMut<'a>(pub &'a mut BTreeMap<String, String>);

impl Injector for HeadersMut<'_> {
    fn set(&mut self, key: &str, value: String) {
        self.0.retain(|name, _| !name.eq_ignore_ascii_case(key));
        self.0.insert(key.to_owned(), value);
    }
}

#[cfg(test)]
mod tests {
    use opentelemetry::trace::TracerProvider as _;
    use opentelemetry_sdk::trace::SdkTracerProvider;
    use tracing_subscriber::layer::SubscriberExt;

    use super::*;

    const INCOMING: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    fn traced<T>(f: impl FnOnce() -> T) -> T {
        let provider = SdkTracerProvider::builder().build();
        let subscriber = tracing_subscriber::registry()
            .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test")));
        tracing::subscriber::with_default(subscriber, f)
    }

    fn trace_id(headers: &BTreeMap<String, String>) -> &str {
        headers[TRACEPARENT].split('-').nth(1).unwrap()
    }

    #[test]
    fn a_continued_span_passes_its_trace_on() {
        traced(|| {
            let incoming = BTreeMap::from([("TraceParent".to_owned(), INCOMING.to_owned())]);
            let span = tracing::info_span!("consume");
            assert!(continue_trace(&span, &Headers(&incoming)));
            let _entered = span.enter();
            let mut outgoing = BTreeMap::new();
            assert!(inject_current(&mut HeadersMut(&mut outgoing)));
            assert_eq!(trace_id(&outgoing), "4bf92f3577b34da6a3ce929d0e0e4736");
            assert_ne!(
                outgoing[TRACEPARENT], INCOMING,
                "a new span id: this span's"
            );
        });
    }

    #[test]
    fn a_span_already_in_the_trace_stays_a_child_of_its_parent() {
        traced(|| {
            let incoming = BTreeMap::from([(TRACEPARENT.to_owned(), INCOMING.to_owned())]);
            let outer = tracing::info_span!("gateway");
            assert!(continue_trace(&outer, &Headers(&incoming)));
            let _outer = outer.enter();
            let inner = tracing::info_span!("idempotency");
            assert!(!continue_trace(&inner, &Headers(&incoming)));
        });
    }

    #[test]
    fn the_callers_context_wins_and_absent_contexts_are_not_invented() {
        traced(|| {
            let mut headers = BTreeMap::from([("Traceparent".to_owned(), INCOMING.to_owned())]);
            let span = tracing::info_span!("producer");
            let _entered = span.enter();
            assert!(!inject_current_if_absent(&mut headers));
            assert_eq!(headers.len(), 1);

            let mut fresh = BTreeMap::new();
            assert!(inject_current_if_absent(&mut fresh));
            assert_ne!(trace_id(&fresh), "4bf92f3577b34da6a3ce929d0e0e4736");
        });
        let mut untraced = BTreeMap::new();
        assert!(!inject_current_if_absent(&mut untraced));
        let junk = BTreeMap::from([(TRACEPARENT.to_owned(), "junk".to_owned())]);
        assert!(!continue_trace(&tracing::info_span!("x"), &Headers(&junk)));
    }
}
