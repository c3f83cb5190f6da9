//! The spans a test process finished, collected in memory through an
//! OpenTelemetry layer, so a test can check that the hops of one operation
//! (an HTTP request, an outbox row, its publishes, every delivery) joined one
//! trace, with the parent each should have.
//!
//! The subscriber is the process's global one: the work under test runs on
//! runtime threads a thread-local subscriber would not reach. Tests in one
//! process share it, so each picks its own spans out by name and trace id.

use std::sync::OnceLock;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider};
use tracing_subscriber::layer::SubscriberExt;

pub use opentelemetry::trace::{SpanId, TraceId};
pub use opentelemetry_sdk::trace::SpanData;

/// The finished spans of this process.
#[derive(Debug)]
pub struct Spans {
    exporter: InMemorySpanExporter,
    _provider: SdkTracerProvider,
}

impl Spans {
    /// Installs the collecting subscriber (once per process) and returns it.
    ///
    /// # Panics
    ///
    /// If another global subscriber was installed first.
    pub fn install() -> &'static Spans {
        static SPANS: OnceLock<Spans> = OnceLock::new();
        SPANS.get_or_init(|| {
            let exporter = InMemorySpanExporter::default();
            let provider = SdkTracerProvider::builder()
                .with_simple_exporter(exporter.clone())
                .build();
            let subscriber = tracing_subscriber::registry()
                .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("idem-testkit")));
            tracing::subscriber::set_global_default(subscriber)
                .expect("no other global subscriber in a test that collects spans");
            Spans {
                exporter,
                _provider: provider,
            }
        })
    }

    /// The finished spans called `name`.
    pub fn named(&self, name: &str) -> Vec<SpanData> {
        self.exporter
            .get_finished_spans()
            .expect("the span collector is not poisoned")
            .into_iter()
            .filter(|span| span.name == name)
            .collect()
    }

    /// The finished spans called `name` in the trace `trace`.
    pub fn in_trace(&self, name: &str, trace: TraceId) -> Vec<SpanData> {
        self.named(name)
            .into_iter()
            .filter(|span| span.span_context.trace_id() == trace)
            .collect()
    }
}

/// The value of a span's attribute (a `tracing` field), as text.
pub fn attribute(span: &SpanData, key: &str) -> Option<String> {
    span.attributes
        .iter()
        .find(|kv| kv.key.as_str() == key)
        .map(|kv| kv.value.as_str().into_owned())
}
