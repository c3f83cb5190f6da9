//! One module per subcommand, each declaring its own arguments (those
//! several commands share are in [`args`]), and the store opening they have
//! in common; [`crate::cli`] parses the command line and calls the module
//! asked for. The demo (`idem demo`) is the `idem-demo` crate's, the proof
//! tools (`idem dup-proxy`, `idem conformance`, `idem torture`) the
//! `idem-proof` crate's, and the benchmarks (`idem bench …`) the `idem-bench`
//! crate's, apart from the product; `idem bench` and `idem torture`, the lab,
//! are built with feature `lab` only.

mod args;
pub(crate) mod audit;
pub(crate) mod audit_log;
pub(crate) mod check;
mod confirm;
pub(crate) mod conformance;
pub(crate) mod console;
pub(crate) mod demo;
pub(crate) mod dlq;
pub(crate) mod dup_proxy;
pub(crate) mod forward;
pub(crate) mod gc;
pub(crate) mod keys;
pub(crate) mod migrate;
mod reconnect;
pub(crate) mod relay;
pub(crate) mod serve;
mod signals;
#[cfg(feature = "lab")]
pub(crate) mod torture;
mod upkeep;

use anyhow::Context;
use idem::{AnyStore, StoreLocation};
use idem_broker::consume::Reconnect;

/// The store used when neither `--store` nor `IDEM_STORE` is given.
pub(crate) use idem_gateway::DEFAULT_STORE;

/// A failed command's error on one line, each cause once: the contexts added
/// here, then the error and its sources as [`idem::error_chain`] writes them
/// (a cause that an outer message already states, or that only wraps one it
/// states, is left out).
pub(crate) fn error_text(error: &anyhow::Error) -> String {
    idem::error_chain(error.as_ref())
}

/// The exit status of a command that failed: 2 for input `idem check` could
/// not read, 1 for everything else.
pub(crate) fn exit_code(error: &anyhow::Error) -> std::process::ExitCode {
    if error.is::<check::BadInput>() {
        std::process::ExitCode::from(2)
    } else {
        std::process::ExitCode::FAILURE
    }
}

fn parse(url: &str) -> anyhow::Result<StoreLocation> {
    url.parse()
        .with_context(|| "invalid --store (or IDEM_STORE)".to_owned())
}

/// The `--store` of a command that needs atomic mode (`what` names it and
/// says why), if given; a Redis or DynamoDB store is refused before anything
/// opens.
pub(crate) fn atomic(store: Option<&str>, what: &str) -> anyhow::Result<Option<StoreLocation>> {
    let Some(location) = store.map(parse).transpose()? else {
        return Ok(None);
    };
    match location {
        StoreLocation::DynamoDb(_) => anyhow::bail!(
            "{what} needs atomic mode, where an effect's SQL and its record commit in one transaction of the store's database, and {location} is a DynamoDB table, which keeps records, attempts and dead letters but no SQL, outbox or fencing leases (its own atomic mode commits DynamoDB writes, through the library's DynamoStore::apply): use a sqlite:// or postgres:// store for it (DynamoDB serves idem serve, idem forward, keys, gc, dlq, audit-log and console)"
        ),
        StoreLocation::Redis(_) => anyhow::bail!(
            "{what} needs atomic mode, where an effect's SQL and its record commit in one transaction of the store's database, and {location} is a Redis store, which holds records only: use a sqlite:// or postgres:// store for it (Redis serves leased mode: idem serve, idem forward)"
        ),
        StoreLocation::Sqlite(_) | StoreLocation::Postgres(_) => Ok(Some(location)),
    }
}

pub(crate) fn location(store: Option<&str>) -> anyhow::Result<StoreLocation> {
    parse(store.unwrap_or(DEFAULT_STORE))
}

pub(crate) async fn open(store: Option<&str>) -> anyhow::Result<AnyStore> {
    let location = location(store)?;
    AnyStore::open(&location)
        .await
        .with_context(|| format!("cannot open the store at {location}"))
}

/// Opens the store of a long-running command (`idem forward`, `idem relay`):
/// a database server that does not answer yet (restarting, behind a network
/// cut) is waited for with the reconnect backoff, for as long as it takes, as
/// the same command waits for a lost connection once it runs. What waiting
/// cannot fix (a wrong URL, refused credentials, a certificate that does not
/// verify, an embedded database file that cannot be opened) ends the command
/// at once.
pub(crate) async fn open_waiting(
    store: Option<&str>,
    reconnect: Reconnect,
) -> anyhow::Result<AnyStore> {
    let location = location(store)?;
    let mut attempt = 0;
    loop {
        match AnyStore::open(&location).await {
            Ok(store) => return Ok(store),
            Err(idem::Error::Store(error))
                if error.kind() == idem::ErrorKind::Unavailable
                    && !matches!(location, StoreLocation::Sqlite(_)) =>
            {
                let delay = reconnect.delay(attempt);
                tracing::warn!(
                    store = %location,
                    error = %idem::error_chain(&error),
                    retry_in_ms = delay.as_millis() as u64,
                    "the store does not answer yet; trying again"
                );
                if attempt == 0 {
                    eprintln!(
                        "the store at {location} does not answer yet ({}); trying again until it does (Ctrl-C stops)",
                        idem::error_chain(&error)
                    );
                }
                tokio::time::sleep(delay).await;
                attempt = attempt.saturating_add(1);
            }
            Err(error) => {
                return Err(error).with_context(|| format!("cannot open the store at {location}"));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use anyhow::Context;
    use idem::{ErrorKind, StoreError};

    use super::error_text;

    /// An io error as a driver wraps it: its own prefix, then the io error's
    /// text, with the io error as its source.
    #[derive(Debug)]
    struct Driver(std::io::Error);

    impl std::fmt::Display for Driver {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "error communicating with database: {}", self.0)
        }
    }

    impl std::error::Error for Driver {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn an_unreachable_store_is_said_once_with_its_hint() {
        let refused = std::io::Error::new(
            std::io::ErrorKind::ConnectionRefused,
            "Connection refused (os error 111)",
        );
        let store = StoreError::with_source(
            ErrorKind::Unavailable,
            "cannot reach PostgreSQL at 127.0.0.1:1: Connection refused (os error 111); is the server running and accepting connections there?",
            Driver(refused),
        );
        let error = Err::<(), _>(idem::Error::Store(store))
            .context("cannot open the store at postgres://postgres@127.0.0.1:1/x")
            .expect_err("an error");
        let text = error_text(&error);
        assert_eq!(
            text,
            "cannot open the store at postgres://postgres@127.0.0.1:1/x: database unavailable: cannot reach PostgreSQL at 127.0.0.1:1: Connection refused (os error 111); is the server running and accepting connections there?"
        );
        assert_eq!(text.matches("Connection refused").count(), 1, "{text}");
    }
}
