//! Turns sqlx errors into Idem's [`StoreError`], in exactly one function
//! (public as [`map_error`]).
//!
//! Everything above this module decides on an [`ErrorKind`] (retry on
//! `SerializationFailure`, `Busy` and `Unavailable`; give up on the rest) and never
//! sees a driver type. The messages are for the person reading a log or a CLI
//! error: they say where the server was (host, port, database, user — never the
//! password) and what to do next.

use std::fmt;
use std::time::Duration;

use idem_core::{ErrorKind, StoreError};
use sqlx::migrate::MigrateError;
use sqlx::postgres::{PgConnectOptions, PgPool};

/// Where the store connects, described without the password, plus the pool
/// limits that explain a pool time-out.
#[derive(Clone)]
pub(crate) struct Endpoint {
    /// `host:port`, or the Unix socket path.
    address: String,
    database: Option<String>,
    user: Option<String>,
    max_connections: u32,
    acquire_timeout: Duration,
}

impl Endpoint {
    /// Describes the server that `options` point at.
    pub(crate) fn new(
        options: &PgConnectOptions,
        max_connections: u32,
        acquire_timeout: Duration,
    ) -> Self {
        let address = match options.get_socket() {
            Some(path) => format!("unix socket {}", path.display()),
            None => format!("{}:{}", options.get_host(), options.get_port()),
        };
        Self {
            address,
            database: options.get_database().map(str::to_owned),
            user: Some(options.get_username().to_owned()),
            max_connections,
            acquire_timeout,
        }
    }

    /// The same, at the servers of a multi-host URL (`h1:5432,h2:5432`).
    pub(crate) fn at(mut self, address: String) -> Self {
        self.address = address;
        self
    }

    /// A connection the caller handed in (the one of its transaction), whose
    /// server this crate was not told about.
    pub(crate) fn callers_connection() -> Self {
        Self {
            address: "the caller's connection".to_owned(),
            database: None,
            user: None,
            max_connections: 1,
            acquire_timeout: Duration::ZERO,
        }
    }

    /// Describes the server behind an existing pool.
    pub(crate) fn of_pool(pool: &PgPool) -> Self {
        let options = pool.options();
        Self::new(
            &pool.connect_options(),
            options.get_max_connections(),
            options.get_acquire_timeout(),
        )
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.address)?;
        match (&self.database, &self.user) {
            (Some(database), Some(user)) => write!(f, " (database {database}, user {user})"),
            (None, Some(user)) => write!(f, " (user {user})"),
            (Some(database), None) => write!(f, " (database {database})"),
            (None, None) => Ok(()),
        }
    }
}

impl fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "\"{self}\"")
    }
}

/// The one mapping from a sqlx error to a store error.
pub(crate) fn store_error(error: sqlx::Error, at: &Endpoint) -> StoreError {
    let (kind, message) = classify(&error, at);
    StoreError::with_source(kind, message, error)
}

/// The mapping of a failed commit. A connection that broke while the commit
/// was on its way leaves the transaction's fate unknown: the server may have
/// committed before the connection went.
pub(crate) fn commit_error(error: sqlx::Error, at: &Endpoint) -> StoreError {
    let (kind, message) = classify(&error, at);
    if kind != ErrorKind::Unavailable {
        return StoreError::with_source(kind, message, error);
    }
    let message = format!(
        "the connection to PostgreSQL at {at} broke while the transaction was being committed, so whether it committed is unknown; run the operation again with the same idempotency key: its outcome is replayed if it committed, and it runs if not"
    );
    StoreError::with_source(ErrorKind::CommitUnknown, message, error)
}

/// The kind of the first sqlx error among `error` and its causes: how an
/// effect's failure is told apart when the database, not the effect, failed.
pub(crate) fn kind_of_cause(
    error: &(dyn std::error::Error + 'static),
    at: &Endpoint,
) -> Option<ErrorKind> {
    std::iter::successors(Some(error), |e| e.source())
        .find_map(|e| e.downcast_ref::<sqlx::Error>())
        .map(|e| classify(e, at).0)
}

/// Maps a sqlx error met on `pool` (the store's, [`PgStore::pool`](crate::PgStore::pool))
/// the way the store maps its own: for code outside this crate that runs its
/// own SQL next to the store's and decides on the [`ErrorKind`].
pub fn map_error(error: sqlx::Error, pool: &PgPool) -> idem_core::Error {
    idem_core::Error::Store(store_error(error, &Endpoint::of_pool(pool)))
}

/// A row that sqlx read fine but that does not hold a valid record (an unknown
/// state, a fingerprint of the wrong length, ...). Reported through
/// [`sqlx::Error::Decode`] so that it reaches [`store_error`] like every other
/// failure, and comes out as [`ErrorKind::Corrupt`].
#[derive(Debug)]
pub(crate) struct BadRow(pub(crate) String);

impl fmt::Display for BadRow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for BadRow {}

impl BadRow {
    /// As a sqlx error.
    pub(crate) fn into_sqlx(message: impl Into<String>) -> sqlx::Error {
        sqlx::Error::Decode(Box::new(Self(message.into())))
    }
}

const RUN_MIGRATIONS: &str = "run the migrations (PgStore::builder(url).migrate(true), or RecordStore::migrate) against this database";

/// A TLS failure: a certificate that did not verify, said so, apart from
/// the rest.
fn tls_failure(error: &rustls::Error, at: &Endpoint) -> (ErrorKind, String) {
    use rustls::CertificateError as C;
    let message = match error {
        rustls::Error::InvalidCertificate(
            C::NotValidForName | C::NotValidForNameContext { .. },
        ) => {
            format!(
                "the TLS certificate of PostgreSQL at {at} did not verify: it is not issued for the host name in the URL ({error}); connect by a name the certificate lists, or use sslmode=verify-ca to check the signing authority only"
            )
        }
        rustls::Error::InvalidCertificate(_) => format!(
            "the TLS certificate of PostgreSQL at {at} did not verify ({error}); sslrootcert in the URL must name the PEM file of the authority that signed the server's certificate (without sslrootcert, the system's trust store is used)"
        ),
        // Not a verdict on the certificate: a handshake the connection's
        // loss cut short, which connecting again may mend.
        other => {
            return (
                ErrorKind::Unavailable,
                format!(
                    "TLS with PostgreSQL at {at} failed: {other}; if it goes on, check the sslmode, sslrootcert, sslcert and sslkey in the URL"
                ),
            );
        }
    };
    (ErrorKind::Config, message)
}

fn classify(error: &sqlx::Error, at: &Endpoint) -> (ErrorKind, String) {
    use sqlx::Error as E;
    match error {
        E::Io(e) => match e
            .get_ref()
            .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        {
            // The TLS handshake reports through I/O errors.
            Some(tls) => tls_failure(tls, at),
            None => (
                ErrorKind::Unavailable,
                format!(
                    "cannot reach PostgreSQL at {at}: {e}; is the server running and accepting connections there?"
                ),
            ),
        },
        E::Tls(e) => match e.downcast_ref::<rustls::Error>() {
            Some(tls) => tls_failure(tls, at),
            None if e.to_string().contains("does not support TLS") => (
                ErrorKind::Config,
                format!(
                    "PostgreSQL at {at} does not offer TLS, and the URL's sslmode (require, verify-ca or verify-full) demands it; turn ssl on in the server's configuration, or connect to one that has it"
                ),
            ),
            // The upgrade to TLS failed on the way (with sslmode=prefer, a
            // connection closed while asking): retried like a lost connection.
            None => (
                ErrorKind::Unavailable,
                format!(
                    "TLS with PostgreSQL at {at} failed: {e}; if it goes on, check the sslmode, sslrootcert, sslcert and sslkey in the URL"
                ),
            ),
        },
        E::PoolTimedOut => (
            ErrorKind::Unavailable,
            format!(
                "no connection to PostgreSQL at {at} within {} ms: the server is down or unreachable, or all {} pooled connections stayed busy; check the server, or raise max_connections",
                at.acquire_timeout.as_millis(),
                at.max_connections
            ),
        ),
        E::PoolClosed => (
            ErrorKind::Unavailable,
            format!(
                "the connection pool to PostgreSQL at {at} was closed; this store can no longer be used, connect a new one"
            ),
        ),
        E::WorkerCrashed => (
            ErrorKind::Unavailable,
            format!("the connection to PostgreSQL at {at} lost its background worker; retry"),
        ),
        E::Configuration(e) => (
            ErrorKind::Config,
            format!(
                "the PostgreSQL connection settings are not valid: {e}; write the URL as postgres://user@host:port/database"
            ),
        ),
        E::Database(db) => {
            let code = db.code().unwrap_or_default();
            let message = db.message();
            if code == "28000" && message.contains("no encryption") {
                return (
                    ErrorKind::Config,
                    format!(
                        "PostgreSQL at {at} requires TLS: it refused a connection without it ({message}); add sslmode=require to the URL, or better sslmode=verify-full&sslrootcert=PATH-TO-CA.pem to check the server's certificate too"
                    ),
                );
            }
            if let Some(advice) = explain_refusal(&code, message) {
                return (
                    ErrorKind::Config,
                    format!("PostgreSQL at {at} answered {code}: {message}; {advice}"),
                );
            }
            let kind = match &*code {
                "23505" => ErrorKind::UniqueViolation,
                "40001" | "40P01" => ErrorKind::SerializationFailure,
                "55P03" => ErrorKind::Busy,
                // 25006: a write sent to a standby (the primary it was
                // before a failover); retried once the primary is found.
                "57P01" | "57P02" | "57P03" | "53300" | "25006" => ErrorKind::Unavailable,
                c if c.starts_with("08") => ErrorKind::Unavailable,
                "3D000" | "28000" | "28P01" => ErrorKind::Config,
                "42P01" | "42703" | "42883" => ErrorKind::Corrupt,
                _ => ErrorKind::Other,
            };
            let advice = match (&*code, kind) {
                (_, ErrorKind::UniqueViolation) => {
                    "a row with the same key already exists; run the operation again".to_owned()
                }
                (_, ErrorKind::SerializationFailure) => {
                    "PostgreSQL aborted the transaction to keep it consistent; run the operation again".to_owned()
                }
                (_, ErrorKind::Busy) => "a lock was not available; retry shortly".to_owned(),
                ("25006", _) => {
                    "the server is read-only: a standby, or a primary demoted in a failover; with several hosts in the URL and target_session_attrs=read-write the store looks for the primary again, so retry".to_owned()
                }
                (_, ErrorKind::Unavailable) => {
                    "the server is shutting down, starting up or out of connections; retry once it is back".to_owned()
                }
                ("28P01", _) => {
                    "authentication failed: check the user and the password (in the URL, PGPASSWORD or the passfile)".to_owned()
                }
                ("3D000", _) => {
                    "create the database (CREATE DATABASE ...) or fix its name in the URL".to_owned()
                }
                (_, ErrorKind::Config) => {
                    "check the user and password in the URL and the server's pg_hba.conf".to_owned()
                }
                (_, ErrorKind::Corrupt) => RUN_MIGRATIONS.to_owned(),
                ("25P02", _) => {
                    "an earlier statement in this transaction failed; an effect must return Err when its SQL fails".to_owned()
                }
                _ => "see the PostgreSQL message above".to_owned(),
            };
            (
                kind,
                format!("PostgreSQL at {at} answered {code}: {message}; {advice}"),
            )
        }
        E::Decode(e) | E::ColumnDecode { source: e, .. } => (
            ErrorKind::Corrupt,
            format!(
                "a row of an idem_* table could not be read: {e}; the table was changed by hand or by an incompatible version of idem"
            ),
        ),
        E::ColumnNotFound(_) | E::ColumnIndexOutOfBounds { .. } | E::TypeNotFound { .. } => (
            ErrorKind::Corrupt,
            format!("an idem_* table does not have the expected shape ({error}); {RUN_MIGRATIONS}"),
        ),
        E::Migrate(m) => match &**m {
            MigrateError::Execute(inner) | MigrateError::ExecuteMigration(inner, _) => {
                let (kind, message) = classify(inner, at);
                (kind, format!("while migrating the schema: {message}"))
            }
            MigrateError::Source(_) => (
                ErrorKind::Other,
                format!("the migrations built into idem-postgres could not be read: {m}"),
            ),
            _ => (
                ErrorKind::Corrupt,
                format!(
                    "the schema in PostgreSQL at {at} was migrated by a different version of idem-postgres ({m}); run the version that migrated it, or a newer one"
                ),
            ),
        },
        // The driver reads the one-byte answer to its TLS request (sslmode
        // prefer and stronger ask on every connect) and reports a connection
        // closed before it as a zero byte the server never sent.
        E::Protocol(text) if text.starts_with("unexpected response from SSLRequest: 0x00") => (
            ErrorKind::Unavailable,
            format!(
                "the connection to PostgreSQL at {at} closed before the server answered its TLS request: the server went away, or the path to it was cut; is the server running and accepting connections there?"
            ),
        ),
        other => (ErrorKind::Other, format!("PostgreSQL at {at}: {other}")),
    }
}

/// What to do about an answer (SQLSTATE `code`, `message`) that says a
/// pooler stands in the way: PgBouncer's refusal of a start-up parameter
/// (`08P01`, "unsupported startup parameter"), or sqlx's prepared
/// statements missing or taken on a shared server connection (`26000`,
/// `42P05`). `None` for any other answer.
pub(crate) fn explain_refusal(code: &str, message: &str) -> Option<&'static str> {
    match code {
        // PgBouncer's protocol violations are all 08P01; only its message
        // tells a refused start-up parameter apart.
        "08P01" if message.contains("unsupported startup parameter") => Some(
            "a connection pooler (PgBouncer) refused a start-up parameter that sqlx sends: add ignore_startup_parameters = extra_float_digits to the [pgbouncer] section of pgbouncer.ini, or pgbouncer=true to the URL (which stops sending it)",
        ),
        "26000" | "42P05" if message.contains("sqlx_s_") => Some(
            "a prepared statement of this connection is missing or another's: is a transaction pooler (PgBouncer with pool_mode = transaction) in between? add pgbouncer=true to the URL",
        ),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use std::str::FromStr;

    use idem_testkit::errors::Wrapped;

    use super::*;

    fn endpoint() -> Endpoint {
        let options = PgConnectOptions::from_str("postgres://app:s3cret@db.example:6543/orders")
            .expect("a valid URL");
        Endpoint::new(&options, 16, Duration::from_secs(5))
    }

    #[test]
    fn connection_failures_are_unavailable_and_name_the_server_but_not_the_password() {
        let refused = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        let error = store_error(sqlx::Error::Io(refused), &endpoint());
        assert_eq!(error.kind(), ErrorKind::Unavailable);
        let text = error.to_string();
        assert!(text.contains("db.example:6543"), "{text}");
        assert!(text.contains("database orders, user app"), "{text}");
        assert!(text.contains("is the server running"), "{text}");
        assert!(!text.contains("s3cret"), "{text}");

        let error = store_error(sqlx::Error::PoolTimedOut, &endpoint());
        assert_eq!(error.kind(), ErrorKind::Unavailable);
        assert!(error.to_string().contains("5000 ms"), "{error}");
        assert_eq!(
            store_error(sqlx::Error::PoolClosed, &endpoint()).kind(),
            ErrorKind::Unavailable
        );
        let closed_at_tls_request =
            sqlx::Error::Protocol("unexpected response from SSLRequest: 0x00".into());
        let error = store_error(closed_at_tls_request, &endpoint());
        assert_eq!(error.kind(), ErrorKind::Unavailable);
        assert!(error.to_string().contains("closed before"), "{error}");
        let odd_answer = sqlx::Error::Protocol("unexpected response from SSLRequest: 0x45".into());
        assert_eq!(
            store_error(odd_answer, &endpoint()).kind(),
            ErrorKind::Other
        );
    }

    #[test]
    fn a_connection_lost_while_committing_leaves_the_outcome_unknown() {
        let reset = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset");
        let error = commit_error(sqlx::Error::Io(reset), &endpoint());
        assert_eq!(error.kind(), ErrorKind::CommitUnknown);
        assert!(error.kind().is_transient());
        assert!(error.to_string().contains("unknown"), "{error}");
        let error = commit_error(BadRow::into_sqlx("odd"), &endpoint());
        assert_eq!(error.kind(), ErrorKind::Corrupt);
    }

    #[test]
    fn an_effects_error_is_classified_through_its_causes() {
        let refused = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        let wrapped = Wrapped(sqlx::Error::Io(refused));
        assert_eq!(
            kind_of_cause(&wrapped, &endpoint()),
            Some(ErrorKind::Unavailable)
        );
        let pool = sqlx::Error::PoolTimedOut;
        assert_eq!(
            kind_of_cause(&pool, &endpoint()),
            Some(ErrorKind::Unavailable)
        );
        let other = std::io::Error::other("not the database");
        assert_eq!(kind_of_cause(&other, &endpoint()), None);
    }

    #[test]
    fn tls_failures_are_config_errors_that_say_what_did_not_verify() {
        let handshake = |error: rustls::Error| {
            sqlx::Error::Io(std::io::Error::new(std::io::ErrorKind::InvalidData, error))
        };
        let cases = [
            (
                handshake(rustls::Error::InvalidCertificate(
                    rustls::CertificateError::UnknownIssuer,
                )),
                "did not verify (invalid peer certificate: UnknownIssuer); sslrootcert",
            ),
            (
                handshake(rustls::Error::InvalidCertificate(
                    rustls::CertificateError::NotValidForName,
                )),
                "not issued for the host name",
            ),
            (
                sqlx::Error::Tls("server does not support TLS".into()),
                "does not offer TLS",
            ),
        ];
        for (error, said) in cases {
            let error = store_error(error, &endpoint());
            assert_eq!(error.kind(), ErrorKind::Config, "{error}");
            let text = error.to_string();
            assert!(text.contains(said), "{text}");
            assert!(text.contains("db.example:6543"), "{text}");
            assert!(!text.contains("s3cret"), "{text}");
        }
    }

    #[test]
    fn bad_rows_are_corrupt() {
        let error = store_error(BadRow::into_sqlx("unknown state \"x\""), &endpoint());
        assert_eq!(error.kind(), ErrorKind::Corrupt);
        assert!(error.to_string().contains("unknown state"), "{error}");
        let error = store_error(sqlx::Error::ColumnNotFound("token".into()), &endpoint());
        assert_eq!(error.kind(), ErrorKind::Corrupt);
    }

    #[test]
    fn a_poolers_refusals_are_explained() {
        let refused = explain_refusal("08P01", "unsupported startup parameter: extra_float_digits");
        assert!(
            refused
                .unwrap()
                .contains("ignore_startup_parameters = extra_float_digits")
        );
        assert!(explain_refusal("08P01", "server conn crashed?").is_none());
        let taken = explain_refusal("42P05", "prepared statement \"sqlx_s_1\" already exists");
        assert!(taken.unwrap().contains("pgbouncer=true"));
        assert!(explain_refusal("23505", "duplicate key").is_none());
    }
}
