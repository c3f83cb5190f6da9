//! Tracing for Idem: one logical operation, and every retry of it, in one
//! trace.
//!
//! An operation keyed once is delivered many times: a client retries a
//! request, a relay publishes an outbox row again, a broker redelivers a
//! message. Each of those runs in a span that names the scope and the key
//! ([`KeyInSpans`] says whether the key is written as it is or as a short
//! hash), and each continues the W3C trace context (`traceparent`,
//! `tracestate`) that came with the request or the message, so a tracing
//! backend shows the first attempt and its retries under one trace id.
//!
//! The context is written in the W3C format by
//! [`TraceContextPropagator`](opentelemetry_sdk::propagation::TraceContextPropagator),
//! whatever global propagator the application installed: the format is the
//! one stored in outbox rows and read back from broker headers, so it must
//! not change with the process that reads it.
//!
//! Spans have an OpenTelemetry context only under a subscriber with a
//! `tracing-opentelemetry` layer. Without one, nothing is injected and a
//! `traceparent` that came in is passed on unchanged, so the trace still
//! links the hops that do export spans.
//!
//! Modules:
//! - `key`: [`KeyInSpans`], the key as it appears in spans;
//! - `context`: [`continue_trace`], [`inject_current`] and [`pass_on`], and the carriers
//!   for header maps ([`Headers`], [`HeadersMut`], [`HttpHeaders`],
//!   [`HttpHeadersMut`]).
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod context;
mod key;

pub use context::{
    Headers, HeadersMut, HttpHeaders, HttpHeadersMut, TRACEPARENT, TRACESTATE, continue_trace,
    inject_current, inject_current_if_absent, pass_on,
};
pub use key::{InvalidKeyInSpans, KeyInSpans};
