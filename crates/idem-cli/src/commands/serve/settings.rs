//! The settings of `idem serve`, from four places in this order: a flag, its
//! `IDEM_*` variable (clap reads both), the `--config` TOML file, the default.
//! Every bad value is reported with where it came from and what to write.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, bail};
use http::{HeaderName, Method};
use idem::StoreLocation;
use idem_http::gateway::{DEFAULT_UPSTREAM_TIMEOUT, GatewayConfig, Upstream};
use idem_http::{DEFAULT_BODY_LIMIT, IdempotencyConfig, KeyRequirement, Mode};
use serde::Deserialize;

use crate::cli::ServeArgs;
use crate::commands::DEFAULT_STORE;
use crate::commands::units::{parse_duration, parse_size};

/// Where the gateway listens by default.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8080";

/// The `--config` file: the flags' names with underscores. Unknown keys are
/// an error, so a misspelt setting is not silently ignored.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileSettings {
    upstream: Option<String>,
    listen: Option<String>,
    store: Option<String>,
    mode: Option<String>,
    require_key: Option<bool>,
    max_body: Option<Size>,
    lease: Option<String>,
    retention: Option<String>,
    admin_listen: Option<String>,
    upstream_timeout: Option<String>,
    principal_header: Option<String>,
    methods: Option<Methods>,
    sweep_every: Option<String>,
}

/// The method list in the file: `"POST,PUT"` or `["POST", "PUT"]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
enum Methods {
    Text(String),
    List(Vec<String>),
}

impl Methods {
    fn text(&self) -> String {
        match self {
            Self::Text(text) => text.clone(),
            Self::List(list) => list.join(","),
        }
    }
}

/// A size in the file: `"1MiB"`, or a number of bytes.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
enum Size {
    Bytes(u64),
    Text(String),
}

impl Size {
    fn text(&self) -> String {
        match self {
            Self::Bytes(n) => n.to_string(),
            Self::Text(text) => text.clone(),
        }
    }
}

impl FileSettings {
    fn read(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read the config file {}", path.display()))?;
        toml::from_str(&text).map_err(|error| {
            anyhow::anyhow!(
                "the config file {} is not valid: {}",
                path.display(),
                error.to_string().trim_end()
            )
        })
    }
}

/// Everything `idem serve` runs with.
#[derive(Debug, Clone)]
pub struct ServeSettings {
    pub upstream: Upstream,
    pub listen: SocketAddr,
    pub store: StoreLocation,
    pub mode: Mode,
    pub require_key: bool,
    pub max_body: usize,
    pub lease: Duration,
    pub retention: Duration,
    pub admin_listen: Option<SocketAddr>,
    pub upstream_timeout: Duration,
    /// `None`: one key space for every caller.
    pub principal_header: Option<HeaderName>,
    /// The methods whose requests are deduplicated by their key.
    pub methods: Vec<Method>,
    /// How often expired records are swept; `None`: never (a cron job runs
    /// `idem gc`).
    pub sweep_every: Option<Duration>,
}

/// One setting's value and where it came from, for error messages.
struct Found {
    value: String,
    origin: String,
}

/// Picks a setting: the flag (or its variable), else the file's key.
struct Sources<'a> {
    file: FileSettings,
    path: Option<&'a Path>,
}

impl Sources<'_> {
    fn pick(
        &self,
        flag: &str,
        env: &str,
        given: Option<String>,
        from_file: impl FnOnce(&FileSettings) -> Option<String>,
    ) -> Option<Found> {
        if let Some(value) = given {
            return Some(Found {
                value,
                origin: format!("--{flag} (or {env})"),
            });
        }
        let value = from_file(&self.file)?;
        let key = flag.replace('-', "_");
        let path = self
            .path
            .map_or_else(String::new, |p| p.display().to_string());
        Some(Found {
            value,
            origin: format!("`{key}` in {path}"),
        })
    }
}

impl ServeSettings {
    /// Resolves every setting; `store` is the global `--store` (or `IDEM_STORE`).
    pub fn resolve(store: Option<&str>, args: &ServeArgs) -> anyhow::Result<Self> {
        let file = match &args.config {
            Some(path) => FileSettings::read(path)?,
            None => FileSettings::default(),
        };
        let sources = Sources {
            file,
            path: args.config.as_deref(),
        };
        let Some(upstream) =
            sources.pick("upstream", "IDEM_UPSTREAM", args.upstream.clone(), |f| {
                f.upstream.clone()
            })
        else {
            bail!(
                "no upstream to forward to: give --upstream http://HOST:PORT (or IDEM_UPSTREAM, or `upstream` in the --config file)"
            );
        };
        let upstream: Upstream = upstream
            .value
            .parse()
            .with_context(|| format!("invalid {}", upstream.origin))?;

        let listen = sources
            .pick("listen", "IDEM_LISTEN", args.listen.clone(), |f| {
                f.listen.clone()
            })
            .map(|found| address(&found))
            .transpose()?
            .unwrap_or_else(|| DEFAULT_LISTEN.parse().expect("a valid default"));
        let admin_listen = sources
            .pick(
                "admin-listen",
                "IDEM_ADMIN_LISTEN",
                args.admin_listen.clone(),
                |f| f.admin_listen.clone(),
            )
            .map(|found| address(&found))
            .transpose()?;

        let store = match store {
            Some(url) => Found {
                value: url.to_owned(),
                origin: "--store (or IDEM_STORE)".to_owned(),
            },
            None => sources
                .pick("store", "IDEM_STORE", None, |f| f.store.clone())
                .unwrap_or(Found {
                    value: DEFAULT_STORE.to_owned(),
                    origin: "the default store".to_owned(),
                }),
        };
        let store: StoreLocation = store
            .value
            .parse()
            .with_context(|| format!("invalid {}", store.origin))?;

        let mode = match sources.pick("mode", "IDEM_MODE", args.mode.clone(), |f| f.mode.clone()) {
            None => Mode::Ietf,
            Some(found) => match found.value.to_ascii_lowercase().as_str() {
                "ietf" => Mode::Ietf,
                "stripe" => Mode::Stripe,
                other => bail!(
                    "invalid {}: {other:?} is not a mode; write ietf or stripe",
                    found.origin
                ),
            },
        };
        let require_key = args
            .require_key
            .or(sources.file.require_key)
            .unwrap_or(false);

        let max_body = match sources.pick("max-body", "IDEM_MAX_BODY", args.max_body.clone(), |f| {
            f.max_body.as_ref().map(Size::text)
        }) {
            None => DEFAULT_BODY_LIMIT,
            Some(found) => {
                parse_size(&found.value).with_context(|| format!("invalid {}", found.origin))?
            }
        };
        let duration = |flag: &str,
                        env: &str,
                        given: &Option<String>,
                        in_file: fn(&FileSettings) -> Option<String>,
                        default: Duration|
         -> anyhow::Result<Duration> {
            match sources.pick(flag, env, given.clone(), in_file) {
                None => Ok(default),
                Some(found) => parse_duration(&found.value)
                    .with_context(|| format!("invalid {}", found.origin)),
            }
        };
        let lease = duration(
            "lease",
            "IDEM_LEASE",
            &args.lease,
            |f| f.lease.clone(),
            idem::DEFAULT_LEASE,
        )?;
        let retention = duration(
            "retention",
            "IDEM_RETENTION",
            &args.retention,
            |f| f.retention.clone(),
            idem::DEFAULT_RETENTION,
        )?;
        let upstream_timeout = duration(
            "upstream-timeout",
            "IDEM_UPSTREAM_TIMEOUT",
            &args.upstream_timeout,
            |f| f.upstream_timeout.clone(),
            DEFAULT_UPSTREAM_TIMEOUT,
        )?;
        if retention <= lease {
            bail!(
                "the retention ({}) must be longer than the lease ({}): answers are kept for the retention, claims are protected for the lease",
                humantime::format_duration(retention),
                humantime::format_duration(lease)
            );
        }

        let principal_header = match sources.pick(
            "principal-header",
            "IDEM_PRINCIPAL_HEADER",
            args.principal_header.clone(),
            |f| f.principal_header.clone(),
        ) {
            None => Some(http::header::AUTHORIZATION),
            Some(found) if found.value.eq_ignore_ascii_case("none") => None,
            Some(found) => Some(HeaderName::try_from(found.value.as_str()).map_err(|_| {
                anyhow::anyhow!(
                    "invalid {}: {:?} is not a header name; write one such as authorization or x-tenant-id, or none",
                    found.origin,
                    found.value
                )
            })?),
        };

        let methods = match sources.pick("methods", "IDEM_METHODS", args.methods.clone(), |f| {
            f.methods.as_ref().map(Methods::text)
        }) {
            None => vec![Method::POST, Method::PATCH],
            Some(found) => {
                parse_methods(&found.value).with_context(|| format!("invalid {}", found.origin))?
            }
        };

        let sweep_every = match sources.pick(
            "sweep-every",
            "IDEM_SWEEP_EVERY",
            args.sweep_every.clone(),
            |f| f.sweep_every.clone(),
        ) {
            None => Some(idem::sweeper::DEFAULT_SWEEP_INTERVAL),
            Some(found) if found.value.trim().eq_ignore_ascii_case("off") => None,
            Some(found) => Some(
                parse_duration(&found.value)
                    .with_context(|| format!("invalid {}", found.origin))?,
            ),
        };

        Ok(Self {
            upstream,
            listen,
            store,
            mode,
            require_key,
            max_body,
            lease,
            retention,
            admin_listen,
            upstream_timeout,
            principal_header,
            methods,
            sweep_every,
        })
    }

    /// The layer's configuration.
    pub fn idempotency(&self) -> IdempotencyConfig {
        let config = IdempotencyConfig::default()
            .mode(self.mode)
            .body_limit(self.max_body)
            .lease(self.lease)
            .retention(self.retention)
            .methods(self.methods.iter().cloned())
            .require_key(if self.require_key {
                KeyRequirement::Always
            } else {
                KeyRequirement::Optional
            });
        match &self.principal_header {
            Some(header) => config.principal_header(header.clone()),
            None => config.without_principal(),
        }
    }

    /// The gateway's configuration.
    pub fn gateway(&self) -> GatewayConfig {
        GatewayConfig::new(self.upstream.clone()).upstream_timeout(self.upstream_timeout)
    }
}

fn address(found: &Found) -> anyhow::Result<SocketAddr> {
    found.value.parse().map_err(|_| {
        anyhow::anyhow!(
            "invalid {}: {:?} is not an address; write IP:PORT, such as 127.0.0.1:8080 or 0.0.0.0:8080",
            found.origin,
            found.value
        )
    })
}

/// A comma-separated method list such as `POST,PATCH,PUT,DELETE`. Safe methods
/// are refused: a GET changes nothing, so there is nothing to deduplicate.
fn parse_methods(text: &str) -> anyhow::Result<Vec<Method>> {
    let mut methods = Vec::new();
    for name in text
        .split(',')
        .map(str::trim)
        .filter(|name| !name.is_empty())
    {
        let method = Method::from_bytes(name.to_ascii_uppercase().as_bytes())
            .map_err(|_| anyhow::anyhow!("{name:?} is not an HTTP method"))?;
        if method.is_safe() {
            bail!(
                "{method} changes nothing on the upstream, so a key on it protects nothing; list methods with effects, such as POST,PATCH,PUT,DELETE"
            );
        }
        if !methods.contains(&method) {
            methods.push(method);
        }
    }
    if methods.is_empty() {
        bail!("no method given; write a list such as POST,PATCH,PUT,DELETE");
    }
    Ok(methods)
}

/// The settings in one line, for the start-up message.
impl std::fmt::Display for ServeSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "store {}; mode {}; key {} on {}; max body {} bytes; lease {}; retention {}; upstream timeout {}; principal {}",
            self.store,
            match self.mode {
                Mode::Ietf => "ietf",
                Mode::Stripe => "stripe",
            },
            if self.require_key {
                "required"
            } else {
                "optional"
            },
            self.methods
                .iter()
                .map(Method::as_str)
                .collect::<Vec<_>>()
                .join(","),
            self.max_body,
            humantime::format_duration(self.lease),
            humantime::format_duration(self.retention),
            humantime::format_duration(self.upstream_timeout),
            self.principal_header
                .as_ref()
                .map_or("none (one key space)", HeaderName::as_str),
        )
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    fn args() -> ServeArgs {
        ServeArgs {
            upstream: None,
            listen: None,
            mode: None,
            require_key: None,
            max_body: None,
            lease: None,
            retention: None,
            admin_listen: None,
            upstream_timeout: None,
            principal_header: None,
            methods: None,
            sweep_every: None,
            config: None,
        }
    }

    fn file(text: &str) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("idem.toml");
        std::fs::write(&path, text).unwrap();
        (dir, path)
    }

    #[test]
    fn defaults_need_only_an_upstream() {
        let mut given = args();
        let error = ServeSettings::resolve(None, &given)
            .unwrap_err()
            .to_string();
        assert!(error.contains("--upstream"), "{error}");
        given.upstream = Some("http://127.0.0.1:9000".into());
        let settings = ServeSettings::resolve(None, &given).unwrap();
        assert_eq!(settings.listen, "127.0.0.1:8080".parse().unwrap());
        assert_eq!(settings.store, StoreLocation::Sqlite("idem.db".into()));
        assert_eq!(settings.mode, Mode::Ietf);
        assert!(!settings.require_key);
        assert_eq!(settings.max_body, 1 << 20);
        assert_eq!(settings.lease, Duration::from_secs(60));
        assert_eq!(settings.retention, Duration::from_secs(7 * 86400));
        assert_eq!(settings.upstream_timeout, Duration::from_secs(30));
        assert_eq!(settings.admin_listen, None);
        assert_eq!(settings.principal_header, Some(http::header::AUTHORIZATION));
        assert_eq!(settings.methods, [Method::POST, Method::PATCH]);
        assert_eq!(settings.sweep_every, Some(Duration::from_secs(60)));
    }

    #[test]
    fn put_and_delete_are_protected_when_listed() {
        let (_dir, path) = file(
            "upstream = \"http://127.0.0.1:9000\"\nmethods = [\"post\", \"PUT\", \"DELETE\"]\n",
        );
        let mut given = args();
        given.config = Some(path);
        let settings = ServeSettings::resolve(None, &given).unwrap();
        assert_eq!(
            settings.methods,
            [Method::POST, Method::PUT, Method::DELETE]
        );
        let config = settings.idempotency();
        assert!(config.accepts_key(&Method::PUT) && config.accepts_key(&Method::DELETE));
        assert!(!config.accepts_key(&Method::PATCH));

        given.methods = Some("POST, PATCH,PUT".into());
        let flagged = ServeSettings::resolve(None, &given).unwrap();
        assert_eq!(flagged.methods, [Method::POST, Method::PATCH, Method::PUT]);

        for (bad, says) in [
            ("GET,POST", "changes nothing"),
            ("", "no method given"),
            ("PO ST", "not an HTTP method"),
        ] {
            given.methods = Some(bad.into());
            let error = format!("{:#}", ServeSettings::resolve(None, &given).unwrap_err());
            assert!(
                error.contains("--methods (or IDEM_METHODS)") && error.contains(says),
                "{bad}: {error}"
            );
        }
    }

    #[test]
    fn flags_beat_the_file_and_the_file_beats_defaults() {
        let (_dir, path) = file(
            r#"
            upstream = "http://127.0.0.1:9000/api"
            listen = "0.0.0.0:8081"
            store = "sqlite:///var/lib/idem/idem.db"
            mode = "stripe"
            require_key = true
            max_body = 4096
            lease = "30s"
            retention = "24h"
            admin_listen = "127.0.0.1:9090"
            upstream_timeout = "5s"
            principal_header = "x-tenant-id"
            sweep_every = "off"
            "#,
        );
        let mut given = args();
        given.config = Some(path);
        let from_file = ServeSettings::resolve(None, &given).unwrap();
        assert_eq!(from_file.upstream.to_string(), "http://127.0.0.1:9000/api");
        assert_eq!(from_file.listen, "0.0.0.0:8081".parse().unwrap());
        assert_eq!(
            from_file.store,
            StoreLocation::Sqlite("/var/lib/idem/idem.db".into())
        );
        assert_eq!(from_file.mode, Mode::Stripe);
        assert!(from_file.require_key);
        assert_eq!(from_file.max_body, 4096);
        assert_eq!(from_file.lease, Duration::from_secs(30));
        assert_eq!(from_file.retention, Duration::from_secs(86400));
        assert_eq!(
            from_file.admin_listen,
            Some("127.0.0.1:9090".parse().unwrap())
        );
        assert_eq!(from_file.upstream_timeout, Duration::from_secs(5));
        assert_eq!(from_file.principal_header.unwrap().as_str(), "x-tenant-id");
        assert_eq!(from_file.sweep_every, None);

        given.upstream = Some("http://10.1.2.3:80".into());
        given.mode = Some("ietf".into());
        given.require_key = Some(false);
        given.max_body = Some("2KiB".into());
        given.lease = Some("10s".into());
        given.principal_header = Some("none".into());
        let flagged = ServeSettings::resolve(Some("sqlite://other.db"), &given).unwrap();
        assert_eq!(flagged.upstream.to_string(), "http://10.1.2.3:80");
        assert_eq!(flagged.store, StoreLocation::Sqlite("other.db".into()));
        assert_eq!(flagged.mode, Mode::Ietf);
        assert!(!flagged.require_key);
        assert_eq!(flagged.max_body, 2048);
        assert_eq!(flagged.lease, Duration::from_secs(10));
        assert_eq!(flagged.principal_header, None);
        // Not given as flags: still from the file.
        assert_eq!(flagged.retention, Duration::from_secs(86400));
        assert_eq!(flagged.listen, "0.0.0.0:8081".parse().unwrap());
    }

    #[test]
    fn bad_input_names_its_source_and_what_to_write() {
        let (_dir, path) = file("upstream = \"http://127.0.0.1:9000\"\nlease_time = \"5s\"\n");
        let mut given = args();
        given.config = Some(path.clone());
        let error = format!("{:#}", ServeSettings::resolve(None, &given).unwrap_err());
        assert!(
            error.contains("lease_time") && error.contains("idem.toml"),
            "{error}"
        );

        let (_dir, path) = file("upstream = \"http://127.0.0.1:9000\"\nmax_body = \"lots\"\n");
        given.config = Some(path);
        let error = format!("{:#}", ServeSettings::resolve(None, &given).unwrap_err());
        assert!(
            error.contains("`max_body` in") && error.contains("1MiB"),
            "{error}"
        );

        let mut given = args();
        given.upstream = Some("http://127.0.0.1:9000".into());
        given.lease = Some("forever".into());
        let error = format!("{:#}", ServeSettings::resolve(None, &given).unwrap_err());
        assert!(
            error.contains("--lease (or IDEM_LEASE)") && error.contains("60s"),
            "{error}"
        );

        given.lease = None;
        given.retention = Some("30s".into());
        let error = format!("{:#}", ServeSettings::resolve(None, &given).unwrap_err());
        assert!(error.contains("longer than the lease"), "{error}");

        given.retention = None;
        given.listen = Some("localhost".into());
        let error = format!("{:#}", ServeSettings::resolve(None, &given).unwrap_err());
        assert!(error.contains("IP:PORT"), "{error}");

        given.listen = None;
        given.mode = Some("paypal".into());
        let error = format!("{:#}", ServeSettings::resolve(None, &given).unwrap_err());
        assert!(error.contains("ietf or stripe"), "{error}");

        given.mode = None;
        let error = format!(
            "{:#}",
            ServeSettings::resolve(Some("mysql://x"), &given).unwrap_err()
        );
        assert!(
            error.contains("--store") && error.contains("sqlite://"),
            "{error}"
        );

        given.upstream = Some("https://example.com".into());
        let error = format!("{:#}", ServeSettings::resolve(None, &given).unwrap_err());
        assert!(
            error.contains("--upstream") && error.contains("plain HTTP"),
            "{error}"
        );
    }
}
