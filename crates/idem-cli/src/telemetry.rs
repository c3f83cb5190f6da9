//! Logs and traces of the `idem` command: the `--log-format` and
//! `--key-in-spans` flags, and the subscriber they set up.
//!
//! Logs go to stderr, filtered by `IDEM_LOG` (`tracing`'s `EnvFilter` syntax,
//! `warn` by default), as text or as one JSON object per line. Colours only
//! when stderr is a terminal: a log file or a collector gets plain text.
//!
//! With the `otlp` feature, and `OTEL_EXPORTER_OTLP_ENDPOINT` set, spans are
//! also exported over OTLP (HTTP, protobuf) — Idem's own spans at info and
//! above, or what `IDEM_TRACE` selects — so the `traceparent` the relay and
//! the consumers pass on names spans a tracing backend has.

use std::io::IsTerminal;

use clap::{Args, ValueEnum};
use idem_trace::KeyInSpans;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer, Registry};

/// How log lines are written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, ValueEnum)]
pub(crate) enum LogFormat {
    /// One line of text per event.
    #[default]
    Text,
    /// One JSON object per event, with its span's fields.
    Json,
}

/// Flags every command takes.
#[derive(Debug, Args)]
pub(crate) struct TelemetryArgs {
    /// How log lines on stderr are written: text, or json (one object per line).
    #[arg(
        long,
        env = "IDEM_LOG_FORMAT",
        value_enum,
        default_value_t = LogFormat::Text,
        global = true
    )]
    pub log_format: LogFormat,
    /// How idempotency keys appear in spans (`serve`, `relay`, `forward`): raw,
    /// or hashed (the first 16 hex digits of the key's BLAKE3 hash).
    #[arg(
        long,
        env = "IDEM_KEY_IN_SPANS",
        value_name = "raw|hashed",
        default_value = "raw",
        global = true
    )]
    pub key_in_spans: KeyInSpans,
}

/// Keeps the span exporter running; flushes it when dropped.
#[derive(Debug)]
pub(crate) struct Telemetry {
    #[cfg(feature = "otlp")]
    provider: Option<opentelemetry_sdk::trace::SdkTracerProvider>,
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        #[cfg(feature = "otlp")]
        if let Some(provider) = self.provider.take()
            && let Err(error) = provider.shutdown()
        {
            eprintln!("warning: spans could not be flushed to the OTLP endpoint: {error}");
        }
    }
}

/// Installs the process's subscriber: logs on stderr, and spans over OTLP when
/// built with `otlp` and an endpoint is configured.
pub(crate) fn install(args: &TelemetryArgs) -> Telemetry {
    let filter = EnvFilter::try_from_env("IDEM_LOG").unwrap_or_else(|_| EnvFilter::new("warn"));
    let logs = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    let logs: Boxed = match args.log_format {
        LogFormat::Text => logs.with_filter(filter).boxed(),
        LogFormat::Json => logs.json().with_filter(filter).boxed(),
    };
    let (spans, telemetry) = exporting();
    let layers: Vec<Boxed> = std::iter::once(logs).chain(spans).collect();
    tracing_subscriber::registry().with(layers).init();
    telemetry
}

type Boxed = Box<dyn Layer<Registry> + Send + Sync>;

/// The layer that exports spans, if any, and what keeps it running.
#[cfg(feature = "otlp")]
fn exporting() -> (Option<Boxed>, Telemetry) {
    match otlp::layer() {
        Ok(Some((layer, provider))) => (
            Some(layer),
            Telemetry {
                provider: Some(provider),
            },
        ),
        Ok(None) => (None, Telemetry { provider: None }),
        Err(error) => {
            eprintln!(
                "warning: spans are not exported: {}",
                crate::commands::error_text(&error)
            );
            (None, Telemetry { provider: None })
        }
    }
}

#[cfg(not(feature = "otlp"))]
fn exporting() -> (Option<Boxed>, Telemetry) {
    (None, Telemetry {})
}

#[cfg(feature = "otlp")]
mod otlp {
    use anyhow::Context;
    use opentelemetry::trace::TracerProvider as _;
    use opentelemetry_sdk::Resource;
    use opentelemetry_sdk::trace::SdkTracerProvider;
    use tracing_subscriber::{EnvFilter, Layer};

    use super::Boxed;

    /// The OpenTelemetry layer exporting to `OTEL_EXPORTER_OTLP_ENDPOINT`
    /// (the exporter reads the standard `OTEL_*` variables), or `None` when
    /// no endpoint is set.
    pub(super) fn layer() -> anyhow::Result<Option<(Boxed, SdkTracerProvider)>> {
        let configured = [
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        ]
        .iter()
        .any(|name| std::env::var_os(name).is_some_and(|v| !v.is_empty()));
        if !configured {
            return Ok(None);
        }
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .build()
            .context("cannot build the OTLP exporter")?;
        let mut resource = Resource::builder();
        if std::env::var_os("OTEL_SERVICE_NAME").is_none() {
            resource = resource.with_service_name("idem");
        }
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(resource.build())
            .build();
        let spans =
            EnvFilter::try_from_env("IDEM_TRACE").unwrap_or_else(|_| EnvFilter::new("idem=info"));
        let layer = tracing_opentelemetry::layer()
            .with_tracer(provider.tracer("idem"))
            .with_filter(spans)
            .boxed();
        Ok(Some((layer, provider)))
    }
}
