//! `idem conformance`'s flags, and the command: run, print the report, and
//! fail when a rule failed.

use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use clap::Args;
use http::{HeaderName, HeaderValue, Method, Uri};
use idem_gateway::parse_duration;

use super::{
    BodyTemplate, ConformanceConfig, DEFAULT_BODY, EffectSource, Expect, FailTrigger, HeaderLine,
};

/// `idem conformance`
#[derive(Debug, Args)]
pub struct ConformanceArgs {
    /// The endpoint to test: http(s)://HOST:PORT/PATH.
    #[arg(value_name = "URL")]
    pub url: Uri,
    /// The path to test, in place of the URL's.
    #[arg(long, value_name = "PATH")]
    pub path: Option<String>,
    /// The method of every request.
    #[arg(long, value_name = "METHOD", default_value = "POST")]
    pub method: Method,
    /// The body of every request; each request gets a number of its own in
    /// place of {seq}.
    #[arg(long, value_name = "TEMPLATE", default_value = DEFAULT_BODY)]
    pub body: BodyTemplate,
    /// The body's Content-Type.
    #[arg(long, value_name = "TYPE", default_value = "application/json")]
    pub content_type: HeaderValue,
    /// The header that carries the key.
    #[arg(long, value_name = "NAME", default_value = "Idempotency-Key")]
    pub key_header: HeaderName,
    /// A header sent with every request, as "Name: value" (credentials);
    /// repeat it for several.
    #[arg(short = 'H', long = "header", value_name = "HEADER")]
    pub headers: Vec<HeaderLine>,
    /// The header that tells callers apart (such as Authorization): runs the
    /// rule that the same key from two principals is two operations.
    #[arg(long, value_name = "NAME")]
    pub principal_header: Option<HeaderName>,
    /// The two values of --principal-header the rule sends, comma-separated
    /// [default: two made-up values].
    #[arg(
        long,
        value_name = "A,B",
        value_delimiter = ',',
        requires = "principal_header"
    )]
    pub principals: Vec<HeaderValue>,
    /// A GET answering the server's effect count (a number, or JSON
    /// {"count": N}), read around each rule.
    #[arg(long, value_name = "URL", conflicts_with = "effects_query")]
    pub effects_url: Option<Uri>,
    /// The server's effect log as a SQL query on --effects-store, as `idem
    /// check --effects-query` reads it (a column `key`, one row per effect);
    /// its rows are the count.
    #[arg(long, value_name = "SQL", requires = "effects_store")]
    pub effects_query: Option<String>,
    /// The database --effects-query runs on: sqlite://PATH or postgres://….
    #[arg(long, value_name = "URL", requires = "effects_query")]
    pub effects_store: Option<String>,
    /// Which refusals pass: ietf (a reused key 422), stripe (400), any.
    #[arg(long = "mode", value_name = "MODE", value_enum, default_value_t = Expect::Any)]
    pub expect: Expect,
    /// How many copies of one request the concurrency rule sends at once.
    #[arg(long, value_name = "N", default_value_t = 8)]
    pub concurrency: usize,
    /// A header, as "Name: value", that makes the server answer 5xx: runs
    /// the rule that a 5xx is not stored.
    #[arg(long, value_name = "HEADER", conflicts_with = "fail_path")]
    pub fail_header: Option<HeaderLine>,
    /// A path that answers 5xx to a key's first request and succeeds on its
    /// retry: runs the rule that a 5xx is not stored.
    #[arg(long, value_name = "PATH")]
    pub fail_path: Option<String>,
    /// A header, as "Name: value", that makes the server apply the request
    /// and then answer 5xx: runs the rule that a retry after such an answer
    /// is not applied again.
    #[arg(long, value_name = "HEADER", conflicts_with = "apply_then_fail_path")]
    pub apply_then_fail_header: Option<HeaderLine>,
    /// A path that applies a key's first request and answers it 5xx, and
    /// applies and answers later ones as the endpoint does: runs the rule
    /// that a retry after such an answer is not applied again.
    #[arg(long, value_name = "PATH")]
    pub apply_then_fail_path: Option<String>,
    /// How long to wait for each answer.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "10s")]
    pub timeout: Duration,
    /// Print the report as JSON, with every request and answer.
    #[arg(long)]
    pub json: bool,
}

impl ConformanceArgs {
    /// The run these flags ask for.
    pub fn config(&self) -> anyhow::Result<ConformanceConfig> {
        let url = match &self.path {
            Some(path) => {
                if !path.starts_with('/') {
                    bail!("--path {path:?} must start with /");
                }
                super::rules::with_path(&self.url, path)
            }
            None => self.url.clone(),
        };
        match url.scheme_str() {
            Some("http" | "https") if url.authority().is_some() => {}
            _ => bail!("{} is not an http:// or https:// URL with a host", self.url),
        }
        let mut config = ConformanceConfig::new(url);
        config.method = self.method.clone();
        config.body = self.body.clone();
        config.content_type = self.content_type.clone();
        config.key_header = self.key_header.clone();
        config.headers = self.headers.clone();
        config.expect = self.expect;
        config.concurrency = self.concurrency;
        config.timeout = self.timeout;
        if self.concurrency < 2 {
            bail!(
                "--concurrency {} sends no duplicate: give 2 or more",
                self.concurrency
            );
        }
        if let Some(header) = &self.principal_header {
            let values = match self.principals.as_slice() {
                [a, b] => [a.clone(), b.clone()],
                [] => [
                    HeaderValue::from_static("idem-conformance-principal-a"),
                    HeaderValue::from_static("idem-conformance-principal-b"),
                ],
                other => bail!(
                    "--principals takes two values, A,B (two callers), not {}",
                    other.len()
                ),
            };
            if values[0] == values[1] {
                bail!("--principals gives the same value twice: give two different callers");
            }
            config.principals = Some((header.clone(), values));
        }
        config.effects = match (&self.effects_url, &self.effects_query, &self.effects_store) {
            (Some(url), _, _) if url.scheme().is_none() || url.authority().is_none() => {
                bail!("--effects-url {url} is not a full URL: give it as http://HOST:PORT/PATH")
            }
            (Some(url), _, _) => Some(EffectSource::Url(url.clone())),
            (None, Some(sql), Some(store)) => Some(EffectSource::Query {
                sql: sql.clone(),
                store: store.clone(),
            }),
            _ => None,
        };
        config.fail = match (&self.fail_header, &self.fail_path) {
            (Some(header), _) => Some(FailTrigger::Header(header.clone())),
            (None, Some(path)) if path.starts_with('/') => Some(FailTrigger::Path(path.clone())),
            (None, Some(path)) => bail!("--fail-path {path:?} must start with /"),
            (None, None) => None,
        };
        config.apply_then_fail = match (&self.apply_then_fail_header, &self.apply_then_fail_path) {
            (Some(header), _) => Some(FailTrigger::Header(header.clone())),
            (None, Some(path)) if path.starts_with('/') => Some(FailTrigger::Path(path.clone())),
            (None, Some(path)) => bail!("--apply-then-fail-path {path:?} must start with /"),
            (None, None) => None,
        };
        Ok(config)
    }
}

/// Runs `idem conformance`: every rule, the report on stdout (a table, or
/// JSON with `--json`), and an error naming the failed rules when any
/// failed.
pub async fn run(args: &ConformanceArgs) -> anyhow::Result<()> {
    let config = args.config()?;
    let report = super::run(&config)
        .await
        .context("idem conformance could not test the endpoint")?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{report}");
    }
    let failed = report.failed();
    if failed.is_empty() {
        return Ok(());
    }
    let names = failed.iter().map(|r| r.rule).collect::<Vec<_>>().join(", ");
    Err(anyhow!(
        "{} of {} rules failed: {names}",
        failed.len(),
        report.rules.len()
    ))
}
