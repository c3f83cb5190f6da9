//! The rules, one module each, and what they share: the run's keys and
//! bodies, the requests they send, and the effect count around them.
//!
//! Every rule uses keys of its own (`idem-conformance-RUN-RULE-N`, `RUN`
//! random per run) and fresh bodies, so no rule sees another's records and a
//! second run against the same server starts clean.

mod ambiguous;
mod concurrent;
mod failure;
mod malformed;
mod missing_key;
mod principals;
mod retry;
mod reuse;

use std::sync::atomic::{AtomicU64, Ordering};

use http::Uri;

use super::client::{Exchange, KeyValue, Outgoing, Sender};
use super::config::{ConformanceConfig, FailTrigger};
use super::effects::{self, EffectsError};
use super::report::{Outcome, RuleReport};

pub(crate) use ambiguous::ambiguous_5xx_applied_once;
pub(crate) use concurrent::concurrent_applied_once;
pub(crate) use failure::failure_not_stored;
pub(crate) use malformed::malformed_keys_refused;
pub(crate) use missing_key::missing_key;
pub(crate) use principals::principals_kept_apart;
pub(crate) use retry::retry_replayed;
pub(crate) use reuse::key_reuse_refused;

/// What the rules of one run share.
pub(crate) struct Run<'a> {
    pub(crate) config: &'a ConformanceConfig,
    pub(crate) sender: Sender,
    id: String,
    next_body: AtomicU64,
}

impl<'a> Run<'a> {
    pub(crate) fn new(config: &'a ConformanceConfig, sender: Sender) -> Self {
        let id = format!("{:08x}", rand::random::<u32>());
        // Small numbers, so a template may put them where a value is
        // checked (an amount): bodies only need to differ within a run, as
        // keys differ from one run to the next.
        Self {
            config,
            sender,
            id,
            next_body: AtomicU64::new(1),
        }
    }

    /// The `n`th key of `rule`.
    pub(crate) fn key(&self, rule: &str, n: usize) -> String {
        format!("idem-conformance-{}-{rule}-{n}", self.id)
    }

    /// A body no other request of the run sent.
    pub(crate) fn body(&self) -> String {
        self.config
            .body
            .body(self.next_body.fetch_add(1, Ordering::Relaxed))
    }

    /// A request to the endpoint under test.
    pub(crate) fn request(&self, key: KeyValue, body: &str) -> Outgoing {
        Outgoing {
            uri: self.config.url.clone(),
            key,
            body: body.to_owned(),
            principal: None,
            extra: Vec::new(),
        }
    }

    /// A keyed request through `trigger` (its header added, or to its
    /// path) and its retry with the same key and body (without the header;
    /// to the same path, which answers the retry as it should).
    pub(crate) fn triggered(
        &self,
        trigger: &FailTrigger,
        key: &str,
        body: &str,
    ) -> (Outgoing, Outgoing) {
        let mut failing = self.keyed(key, body);
        match trigger {
            FailTrigger::Header(header) => {
                failing
                    .extra
                    .push((header.name.clone(), header.value.clone()));
                (failing, self.keyed(key, body))
            }
            FailTrigger::Path(path) => {
                failing.uri = with_path(&self.config.url, path);
                (failing.clone(), failing)
            }
        }
    }

    /// A keyed request to the endpoint under test.
    pub(crate) fn keyed(&self, key: &str, body: &str) -> Outgoing {
        self.request(KeyValue::Key(key.to_owned()), body)
    }

    pub(crate) async fn send(&self, outgoing: Outgoing) -> Exchange {
        self.sender.send(outgoing).await
    }

    /// The effect count now, when effects are counted.
    pub(crate) async fn count(&self) -> Result<Option<u64>, EffectsError> {
        match &self.config.effects {
            Some(source) => effects::count(&self.sender, source).await.map(Some),
            None => Ok(None),
        }
    }

    /// The effects applied since `before` was read.
    pub(crate) async fn applied_since(
        &self,
        before: Option<u64>,
    ) -> Result<Option<u64>, EffectsError> {
        let now = self.count().await?;
        Ok(before
            .zip(now)
            .map(|(before, now)| now.saturating_sub(before)))
    }
}

/// A rule's report, built as it goes.
pub(crate) struct Finding {
    pub(crate) rule: &'static str,
    pub(crate) asks: &'static str,
    pub(crate) exchanges: Vec<Exchange>,
    pub(crate) effects: Option<u64>,
    pub(crate) effects_expected: Option<u64>,
}

impl Finding {
    pub(crate) fn new(rule: &'static str, asks: &'static str) -> Self {
        Self {
            rule,
            asks,
            exchanges: Vec::new(),
            effects: None,
            effects_expected: None,
        }
    }

    /// Records `exchange` and hands it back.
    pub(crate) fn saw(&mut self, exchange: Exchange) -> Exchange {
        self.exchanges.push(exchange.clone());
        exchange
    }

    pub(crate) fn counted(&mut self, applied: Option<u64>, expected: u64) {
        self.effects = applied;
        self.effects_expected = applied.map(|_| expected);
    }

    pub(crate) fn end(self, outcome: Outcome, detail: impl Into<String>) -> RuleReport {
        RuleReport {
            rule: self.rule,
            asks: self.asks,
            outcome,
            detail: detail.into(),
            effects: self.effects,
            effects_expected: self.effects_expected,
            exchanges: self.exchanges,
        }
    }

    /// The end of a rule whose first request, which had to succeed, did not.
    pub(crate) fn unusable(self, first: &Exchange) -> RuleReport {
        let detail = match &first.error {
            Some(error) => format!("no answer to the first request: {error}"),
            None => format!(
                "the first request was answered {}, not 2xx, so the rule has nothing to retry: check the URL, --method, --body and -H (credentials)",
                first.status_text()
            ),
        };
        self.end(Outcome::Fail, detail)
    }
}

/// The endpoint's URL with another path (for `--fail-path` and
/// `--apply-then-fail-path`).
pub(crate) fn with_path(url: &Uri, path: &str) -> Uri {
    let mut parts = url.clone().into_parts();
    parts.path_and_query = path.parse().ok();
    Uri::from_parts(parts).unwrap_or_else(|_| url.clone())
}
