//! Where a store lives, written as a URL: `sqlite://PATH`, `postgres://...`,
//! `redis://HOST:PORT/DB`, `redis+cluster://HOST:PORT,HOST:PORT`, or
//! `dynamodb:///TABLE` (`dynamodb+http://KEY:SECRET@HOST:PORT/TABLE` for an
//! emulator).

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use crate::redact_url;

/// A parsed store location. It is shown (`Display`, `Debug`) through
/// [`redact_url`], without its password or query.
#[derive(Clone, PartialEq, Eq)]
pub enum StoreLocation {
    /// An embedded SQLite file (`sqlite://idem.db`, `sqlite:///var/lib/idem.db`).
    Sqlite(PathBuf),
    /// A PostgreSQL connection URL (`postgres://user@host:5432/db`).
    Postgres(String),
    /// A Redis URL, one node (`redis://[USER:PASSWORD@]HOST:PORT/DB`) or a
    /// cluster (`redis+cluster://HOST:PORT,HOST:PORT`): leased mode only.
    Redis(String),
    /// A DynamoDB table (`dynamodb:///TABLE` with the AWS chain's endpoint,
    /// region and credentials, `dynamodb://HOST/TABLE`, or
    /// `dynamodb+http://KEY:SECRET@HOST:PORT/TABLE` for an emulator): leased
    /// mode, and atomic mode for effects that are DynamoDB writes.
    DynamoDb(String),
}

impl StoreLocation {
    /// Whether the store here offers atomic mode for SQL effects (the
    /// effect and its record in one transaction), with the outbox and
    /// fencing leases: SQLite and PostgreSQL do. Redis holds records only,
    /// so an effect cannot commit with them; DynamoDB commits only effects
    /// that are DynamoDB writes, and keeps no outbox.
    pub fn offers_atomic_mode(&self) -> bool {
        !matches!(self, Self::Redis(_) | Self::DynamoDb(_))
    }
}

/// A store URL that could not be understood.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LocationError {
    /// The URL names a scheme Idem has no store for.
    #[error(
        "unknown store URL scheme {scheme:?} in {url:?}: use sqlite://PATH for the embedded store, postgres://USER@HOST:PORT/DATABASE, redis://HOST:PORT/DB (redis+cluster://HOST:PORT,HOST:PORT for a cluster) for leased mode, or dynamodb:///TABLE (dynamodb+http://KEY:SECRET@HOST:PORT/TABLE for an emulator)"
    )]
    UnknownScheme {
        /// The scheme found.
        scheme: String,
        /// The URL as given, through [`redact_url`].
        url: String,
    },
    /// The text has no `scheme://` part.
    #[error(
        "store {url:?} is not a URL: write sqlite://{url} for an embedded SQLite file, or postgres://USER@HOST:PORT/DATABASE"
    )]
    NoScheme {
        /// The text as given.
        url: String,
    },
    /// The text has no `scheme://` part and does not look like a file path
    /// (it has `@`, `=`, `:` or spaces, as in `user:password@host` or libpq's
    /// `host=... password=...`): it is not repeated, as it may hold a
    /// password.
    #[error(
        "the store is not a URL (it is not repeated here, as it may hold a password): write postgres://USER:PASSWORD@HOST:PORT/DATABASE (with ?sslmode=... for TLS), or sqlite://PATH for an embedded SQLite file"
    )]
    NotAUrl,
    /// `sqlite://` with no path.
    #[error(
        "store URL {url:?} has no file path: write sqlite://idem.db or sqlite:///absolute/path.db"
    )]
    EmptyPath {
        /// The URL as given.
        url: String,
    },
    /// `redis://` or `redis+cluster://` with no host.
    #[error(
        "store URL {url:?} names no Redis host: write redis://HOST:PORT/DB, or redis+cluster://HOST:PORT,HOST:PORT for a cluster"
    )]
    NoHost {
        /// The URL as given, through [`redact_url`].
        url: String,
    },
    /// `dynamodb://` or `dynamodb+http://` naming no table.
    #[error(
        "store URL {url:?} names no DynamoDB table: write dynamodb:///TABLE, dynamodb://HOST/TABLE, or dynamodb+http://KEY:SECRET@HOST:PORT/TABLE for an emulator"
    )]
    NoTable {
        /// The URL as given, through [`redact_url`].
        url: String,
    },
    /// `rediss://`: TLS to Redis, which the Redis store does not offer.
    #[error(
        "store URL {url:?} asks for TLS to Redis (rediss://), which the Redis store does not offer: reach Redis over a trusted network or a TLS tunnel with a redis:// URL"
    )]
    RedisTls {
        /// The URL as given, through [`redact_url`].
        url: String,
    },
}

impl FromStr for StoreLocation {
    type Err = LocationError;

    fn from_str(url: &str) -> Result<Self, LocationError> {
        let Some((scheme, rest)) = url.split_once("://") else {
            if url.contains(['@', '=', ':']) || url.contains(char::is_whitespace) {
                return Err(LocationError::NotAUrl);
            }
            return Err(LocationError::NoScheme {
                url: url.to_owned(),
            });
        };
        match scheme.to_ascii_lowercase().as_str() {
            "sqlite" if rest.is_empty() => Err(LocationError::EmptyPath {
                url: url.to_owned(),
            }),
            "sqlite" => Ok(Self::Sqlite(PathBuf::from(rest))),
            "postgres" | "postgresql" => Ok(Self::Postgres(url.to_owned())),
            // The hosts as the URL is shown (redacted): its authority after
            // the last `@`, without a query or fragment, so what is accepted
            // is what shows, and what shows parses again.
            "redis" | "redis+cluster" if !names_a_host(&redact_url(url)) => {
                Err(LocationError::NoHost {
                    url: redact_url(url),
                })
            }
            "redis" | "redis+cluster" => Ok(Self::Redis(url.to_owned())),
            "dynamodb" | "dynamodb+http" if !names_a_table(&redact_url(url)) => {
                Err(LocationError::NoTable {
                    url: redact_url(url),
                })
            }
            "dynamodb" | "dynamodb+http" => Ok(Self::DynamoDb(url.to_owned())),
            "rediss" | "rediss+cluster" => Err(LocationError::RedisTls {
                url: redact_url(url),
            }),
            _ => Err(LocationError::UnknownScheme {
                scheme: scheme.to_owned(),
                url: redact_url(url),
            }),
        }
    }
}

/// Whether a `redis://` URL names a host: something between its user-info and
/// its path, query or fragment.
fn names_a_host(url: &str) -> bool {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    rest.split('/')
        .next()
        .and_then(|authority| authority.rsplit('@').next())
        .and_then(|hosts| hosts.split(['?', '#']).next())
        .is_some_and(|hosts| !hosts.trim_matches(',').is_empty())
}

/// Whether a `dynamodb://` URL has a path naming a table (what the table's
/// name may be, DynamoDB's rule, is checked when the store opens).
fn names_a_table(url: &str) -> bool {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    rest.split_once('/')
        .map(|(_, path)| path.split(['?', '#']).next().unwrap_or(""))
        .is_some_and(|table| !table.trim_matches('/').is_empty())
}

impl fmt::Display for StoreLocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Sqlite(path) => write!(f, "sqlite://{}", path.display()),
            Self::Postgres(url) | Self::Redis(url) | Self::DynamoDb(url) => {
                f.write_str(&redact_url(url))
            }
        }
    }
}

impl fmt::Debug for StoreLocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "StoreLocation({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_both_stores_and_explains_the_rest() {
        assert_eq!(
            "sqlite://idem.db".parse(),
            Ok(StoreLocation::Sqlite("idem.db".into()))
        );
        assert_eq!(
            "sqlite:///var/lib/idem.db".parse(),
            Ok(StoreLocation::Sqlite("/var/lib/idem.db".into()))
        );
        assert!(matches!(
            "postgresql://u@h/db".parse(),
            Ok(StoreLocation::Postgres(_))
        ));
        let err = "mysql://root:secret@localhost/db"
            .parse::<StoreLocation>()
            .unwrap_err();
        assert!(
            matches!(err, LocationError::UnknownScheme { ref scheme, .. } if scheme == "mysql")
        );
        let text = err.to_string();
        assert!(
            text.contains("sqlite://PATH") && !text.contains("secret"),
            "{text}"
        );
        assert!(matches!(
            "idem.db".parse::<StoreLocation>(),
            Err(LocationError::NoScheme { .. })
        ));
        assert!(matches!(
            "sqlite://".parse::<StoreLocation>(),
            Err(LocationError::EmptyPath { .. })
        ));
    }

    #[test]
    fn text_that_is_not_a_url_is_not_repeated_when_it_may_hold_a_password() {
        for text in [
            "app:hunter2@db:5432/idem",
            "host=db user=app password=hunter2",
            "postgres:/app:hunter2@db/idem",
        ] {
            let err = text.parse::<StoreLocation>().unwrap_err();
            assert_eq!(err, LocationError::NotAUrl, "{text}");
            let shown = format!("{err} {err:?}");
            assert!(!shown.contains("hunter2"), "{shown}");
            assert!(shown.contains("postgres://USER:PASSWORD@"), "{shown}");
        }
    }

    #[test]
    fn parses_redis_and_redis_cluster_urls() {
        let single: StoreLocation = "redis://:hunter2@cache:6379/2".parse().unwrap();
        assert_eq!(
            single,
            StoreLocation::Redis("redis://:hunter2@cache:6379/2".into())
        );
        assert_eq!(single.to_string(), "redis://:***@cache:6379/2");
        assert!(!single.offers_atomic_mode());
        let cluster: StoreLocation = "redis+cluster://app:hunter2@a:7000,b:7001".parse().unwrap();
        assert_eq!(cluster.to_string(), "redis+cluster://app:***@a:7000,b:7001");
        assert!(format!("{cluster:?}").contains("a:7000,b:7001"));
        assert!(!format!("{cluster:?}").contains("hunter2"));
        for empty in ["redis://", "redis+cluster://:pw@", "redis+cluster://,/0"] {
            let err = empty.parse::<StoreLocation>().unwrap_err();
            assert!(
                matches!(err, LocationError::NoHost { .. }),
                "{empty}: {err}"
            );
            assert!(!err.to_string().contains("pw@"), "{err}");
        }
        let tls = "rediss://:hunter2@cache:6380"
            .parse::<StoreLocation>()
            .unwrap_err();
        assert!(matches!(tls, LocationError::RedisTls { .. }));
        assert!(!tls.to_string().contains("hunter2"), "{tls}");
        assert!(StoreLocation::Sqlite("x.db".into()).offers_atomic_mode());
    }

    #[test]
    fn parses_dynamodb_urls() {
        let chain: StoreLocation = "dynamodb:///idem".parse().unwrap();
        assert_eq!(chain, StoreLocation::DynamoDb("dynamodb:///idem".into()));
        assert!(!chain.offers_atomic_mode());
        let moto: StoreLocation =
            "dynamodb+http://key:hunter2@127.0.0.1:5000/idem?region=eu-west-1"
                .parse()
                .unwrap();
        assert_eq!(
            moto.to_string(),
            "dynamodb+http://key:***@127.0.0.1:5000/idem"
        );
        assert!(!format!("{moto:?}").contains("hunter2"));
        for empty in [
            "dynamodb://",
            "dynamodb:///",
            "dynamodb+http://k:pw@h:1/?region=x",
        ] {
            let err = empty.parse::<StoreLocation>().unwrap_err();
            assert!(
                matches!(err, LocationError::NoTable { .. }),
                "{empty}: {err}"
            );
            assert!(!err.to_string().contains("pw@"), "{err}");
        }
        let unknown = "dynamo://h/t".parse::<StoreLocation>().unwrap_err();
        assert!(
            unknown.to_string().contains("dynamodb:///TABLE"),
            "{unknown}"
        );
    }

    #[test]
    fn display_hides_passwords() {
        let location: StoreLocation = "postgres://app:hunter2@db:5432/idem?sslmode=require"
            .parse()
            .unwrap();
        assert_eq!(location.to_string(), "postgres://app:***@db:5432/idem");
        assert_eq!(
            format!("{location:?}"),
            "StoreLocation(postgres://app:***@db:5432/idem)"
        );
    }
}
