//! The settings written back out: as a config file that resolves to them
//! again ([`GatewaySettings::to_toml`]), and in one line for the start-up
//! message.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use http::{HeaderName, Method};
use idem::StoreLocation;
use idem_http::{Concurrent, Mode};

use super::GatewaySettings;
use crate::TLS_SUBJECT;

impl GatewaySettings {
    /// These settings as a config file that resolves to them again, every
    /// key written out (the store's and the upstream's passwords included:
    /// keep the file as private as the settings it came from).
    pub fn to_toml(&self) -> String {
        let store = match &self.store {
            StoreLocation::Sqlite(path) => format!("sqlite://{}", path.display()),
            StoreLocation::Postgres(url)
            | StoreLocation::Redis(url)
            | StoreLocation::DynamoDb(url) => url.clone(),
        };
        let mut lines = vec![
            format!(
                "upstream = {}",
                quoted(&self.upstream.to_url_with_password())
            ),
            format!("listen = {}", quoted(&self.listen.to_string())),
            format!("store = {}", quoted(&store)),
            format!("mode = {}", quoted(mode_name(self.mode))),
            format!("require_key = {}", self.require_key),
            format!("max_body = {}", self.max_body),
            format!("lease = {}", quoted(&duration_text(self.lease))),
            format!("retention = {}", quoted(&duration_text(self.retention))),
            format!(
                "tombstones = {}",
                quoted(
                    &self
                        .tombstones
                        .map_or_else(|| "off".to_owned(), duration_text)
                )
            ),
            format!(
                "upstream_timeout = {}",
                quoted(&duration_text(self.upstream_timeout))
            ),
            format!(
                "body_timeout = {}",
                quoted(&duration_text(self.body_timeout))
            ),
            format!(
                "spool = {}",
                quoted(
                    &self
                        .spool
                        .as_ref()
                        .map_or_else(|| "off".to_owned(), |p| p.display().to_string())
                )
            ),
            format!(
                "principal_header = {}",
                quoted(if self.principal_tls_subject {
                    TLS_SUBJECT
                } else {
                    self.principal_header
                        .as_ref()
                        .map_or("none", HeaderName::as_str)
                })
            ),
            format!(
                "methods = [{}]",
                self.methods
                    .iter()
                    .map(|m| quoted(m.as_str()))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            format!(
                "sweep_every = {}",
                quoted(
                    &self
                        .sweep_every
                        .map_or_else(|| "off".to_owned(), duration_text)
                )
            ),
            format!(
                "max_in_flight = {}",
                self.max_in_flight
                    .map_or_else(|| quoted("off"), |limit| limit.to_string())
            ),
            format!("runtime = {}", quoted(self.runtime.as_str())),
            format!("concurrent = {}", quoted(&concurrent_text(self.concurrent))),
            format!("max_waiters = {}", self.waiter_caps.total),
            format!("max_waiters_per_key = {}", self.waiter_caps.per_key),
            format!(
                "routes = [{}]",
                self.routes
                    .iter()
                    .map(|r| quoted(r))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            format!(
                "grpc_unary = [{}]",
                self.grpc_unary
                    .iter()
                    .map(|m| quoted(m))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        ];
        if let Some(fields) = self.fingerprint.selected() {
            lines.push(format!("fingerprint = {}", quoted(&fields)));
        }
        if let Some(fields) = self.fingerprint.ignored() {
            lines.push(format!("fingerprint_ignore = {}", quoted(&fields)));
        }
        if !self.fingerprint.headers().is_empty() {
            lines.push(format!(
                "fingerprint_header = [{}]",
                self.fingerprint
                    .headers()
                    .iter()
                    .map(|h| quoted(h))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        if let Some(workers) = self.workers {
            lines.push(format!("workers = {workers}"));
        }
        if let Some(admin) = self.admin_listen {
            lines.push(format!("admin_listen = {}", quoted(&admin.to_string())));
        }
        if let Some(probe) = &self.probe {
            lines.push(format!("probe = {}", quoted(&probe.to_string())));
        }
        if let Some(probe) = &self.grpc_probe {
            lines.push(format!("grpc_probe = {}", quoted(probe)));
        }
        if let Some(policy) = &self.on_grpc_status {
            lines.push(format!("on_grpc_status = {}", quoted(policy)));
        }
        lines.push(format!(
            "on_status = {}",
            quoted(&self.on_status.describe())
        ));
        let mut file = |key: &str, path: Option<&PathBuf>| {
            if let Some(path) = path {
                lines.push(format!("{key} = {}", quoted(&path.display().to_string())));
            }
        };
        file("upstream_ca", self.upstream_tls.ca.as_ref());
        file("upstream_cert", self.upstream_tls.cert.as_ref());
        file("upstream_key", self.upstream_tls.key.as_ref());
        file("tls_cert", self.tls.as_ref().map(|tls| &tls.cert));
        file("tls_key", self.tls.as_ref().map(|tls| &tls.key));
        file(
            "tls_client_ca",
            self.tls.as_ref().and_then(|tls| tls.client_ca.as_ref()),
        );
        file("admin_token_file", self.admin_token_file.as_ref());
        if self.allow_hosts.is_extended() {
            let names: Vec<String> = self.allow_hosts.added().iter().map(|n| quoted(n)).collect();
            lines.push(format!("allow_hosts = [{}]", names.join(", ")));
        }
        lines.join("\n") + "\n"
    }
}

/// The settings in one line, for the start-up message.
impl fmt::Display for GatewaySettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "store {}; mode {}; key {} on {}; max body {} bytes; lease {}; retention {}; upstream timeout {}; body timeout {}; principal {}; in flight {}; runtime {}; fingerprint {}; concurrent duplicates {}",
            self.store,
            mode_name(self.mode),
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
            humantime::format_duration(self.body_timeout),
            if self.principal_tls_subject {
                "the client certificate's subject"
            } else {
                self.principal_header
                    .as_ref()
                    .map_or("none (one key space)", HeaderName::as_str)
            },
            self.max_in_flight.map_or_else(
                || "unlimited".to_owned(),
                |limit| format!("at most {limit}")
            ),
            match (self.runtime, self.workers) {
                (crate::Runtime::PerCore, Some(workers)) => format!("per-core ({workers})"),
                (runtime, _) => runtime.to_string(),
            },
            self.fingerprint,
            match self.concurrent {
                Concurrent::Reject => "409 at once".to_owned(),
                Concurrent::Wait(up_to) => format!(
                    "wait up to {} (at most {} per key, {} in all)",
                    duration_text(up_to),
                    self.waiter_caps.per_key,
                    self.waiter_caps.total
                ),
            },
        )?;
        let probed = self.probe.is_some();
        let verdicts = [500, 502, 503, 504, 429]
            .into_iter()
            .filter_map(|code| http::StatusCode::from_u16(code).ok())
            .map(|status| {
                format!(
                    "{}={}",
                    status.as_u16(),
                    self.on_status.verdict(status, probed)
                )
            })
            .collect::<Vec<_>>()
            .join(",");
        write!(f, "; answers {} ({verdicts})", self.on_status.describe())
    }
}

fn mode_name(mode: Mode) -> &'static str {
    match mode {
        Mode::Ietf => "ietf",
        Mode::Stripe => "stripe",
    }
}

/// What a concurrent duplicate gets, as [`parse_concurrent`] reads it.
fn concurrent_text(concurrent: Concurrent) -> String {
    match concurrent {
        Concurrent::Reject => "reject".to_owned(),
        Concurrent::Wait(up_to) => format!("wait:{}", duration_text(up_to)),
    }
}

/// A TOML basic string.
fn quoted(text: &str) -> String {
    toml::Value::String(text.to_owned()).to_string()
}

/// A duration as [`parse_duration`] reads it back exactly.
pub(super) fn duration_text(duration: Duration) -> String {
    humantime::format_duration(duration).to_string()
}
