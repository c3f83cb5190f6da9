//! The Rust examples of the README and of the book in `docs/`, compiled as doc
//! tests so that they cannot drift from the code.
//!
//! Each item below includes one Markdown file; rustdoc then treats every
//! ```` ```rust ```` block in it as a doc test. Examples on the embedded SQLite
//! store run; those that need a server (PostgreSQL, RabbitMQ, NATS) are marked
//! `no_run` and are only compiled. Blocks in other languages (`text`,
//! `console`, `toml`) are left alone.
//!
//! `cargo test -p idem-doctests --doc` runs them all; `scripts/test.sh` runs
//! them with the rest of the workspace's doc tests.
#![forbid(unsafe_code)]
// An example that warns (an unused import, a needless `mut`) fails: the book
// shows the code as it is compiled.
#![doc(test(attr(deny(warnings))))]

/// Includes a Markdown file as the documentation of a unit struct that exists
/// only when rustdoc collects doc tests.
macro_rules! doctests {
    ($($name:ident => $path:literal,)*) => {$(
        #[doc = include_str!($path)]
        #[cfg(doctest)]
        pub struct $name;
    )*};
}

doctests! {
    ReadmeDoctests => "../../../README.md",
    ProtocolDoctests => "../../../docs/src/protocol.md",
    AtomicDoctests => "../../../docs/src/atomic.md",
    LeasedDoctests => "../../../docs/src/leased.md",
    BatchesDoctests => "../../../docs/src/batches.md",
    RetentionDoctests => "../../../docs/src/retention.md",
    HttpDoctests => "../../../docs/src/http.md",
    GrpcDoctests => "../../../docs/src/grpc.md",
    ConsumersDoctests => "../../../docs/src/consumers.md",
    KafkaDoctests => "../../../docs/src/kafka.md",
    SqsDoctests => "../../../docs/src/sqs.md",
    DeadLettersDoctests => "../../../docs/src/dead-letters.md",
    OutboxDoctests => "../../../docs/src/outbox.md",
    WindowsDoctests => "../../../docs/src/windows.md",
    RetriesDoctests => "../../../docs/src/retries.md",
    OrderingDoctests => "../../../docs/src/ordering.md",
    DefaultsDoctests => "../../../docs/src/defaults.md",
    StoresDoctests => "../../../docs/src/stores.md",
    DynamoDbDoctests => "../../../docs/src/dynamodb.md",
    ObservabilityDoctests => "../../../docs/src/observability.md",
    TracingDoctests => "../../../docs/src/tracing.md",
    CheckDoctests => "../../../docs/src/check.md",
}
