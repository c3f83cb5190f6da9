//! `idem conformance URL`: tests any HTTP endpoint that claims
//! `Idempotency-Key` semantics against the behaviours the IETF draft and
//! Stripe's API define, and reports, rule by rule, what was sent and what
//! came back.
//!
//! # Why count effects
//!
//! Answers are what a server says; effects are what it did. A server that
//! applies a retry a second time and answers the same bytes looks, from its
//! answers, like one that replays. So every rule reads the server's effect
//! count around its requests when it is given a way to read it
//! ([`EffectSource`]): a URL answering the count, or a query on the
//! server's database, as `idem check` reads effect logs. Without one, a rule
//! whose answers cannot tell the two apart ends [`Outcome::Unproven`]
//! rather than passing.
//!
//! # Modules
//!
//! - `config`: what is tested and what passes ([`ConformanceConfig`]);
//! - `client`: sending a request and keeping what came back ([`Exchange`]);
//! - `effects`: reading the count;
//! - `rules`: the rules, one module each;
//! - [`report`]: the outcome per rule, as a table or JSON;
//! - [`command`]: `idem conformance`'s flags ([`ConformanceArgs`]).

mod client;
pub mod command;
mod config;
mod effects;
pub mod report;
mod rules;

pub use client::Exchange;
pub use command::ConformanceArgs;
pub use config::{
    BodyTemplate, ConformanceConfig, DEFAULT_BODY, EffectSource, Expect, FailTrigger, HeaderLine,
    NoPlaceholder, PLACEHOLDER,
};
pub use effects::EffectsError;
pub use report::{Outcome, Report, RuleReport};

use client::Sender;
use rules::Run;

/// Why a run could not be made.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConformanceError {
    /// The effect count could not be read.
    #[error(transparent)]
    Effects(#[from] EffectsError),
    /// The endpoint did not answer at all.
    #[error("{url} does not answer ({cause}); is the server running, and is the URL right?")]
    Unreachable {
        /// The endpoint.
        url: String,
        /// What the client said.
        cause: String,
    },
}

/// Runs every rule against the endpoint `config` names, one after the
/// other, and reports. Errors only when the endpoint or the effect count
/// cannot be reached; a server that breaks rules gives a report whose
/// [`Report::failed`] lists them.
pub async fn run(config: &ConformanceConfig) -> Result<Report, ConformanceError> {
    let sender = Sender::new(
        config.method.clone(),
        config.content_type.clone(),
        config.key_header.clone(),
        config.expect.quotes_keys(),
        config
            .headers
            .iter()
            .map(|h| (h.name.clone(), h.value.clone()))
            .collect(),
        config.timeout,
    );
    let run = Run::new(config, sender);
    // Read once first, so a wrong effects source ends the run before any
    // request is sent.
    run.count().await?;

    let mut reports = Vec::new();
    let [retry, marker] = rules::retry_replayed(&run).await?;
    if let Some(first) = retry.exchanges.first()
        && first.status.is_none()
    {
        return Err(ConformanceError::Unreachable {
            url: config.url.to_string(),
            cause: first.error.clone().unwrap_or_default(),
        });
    }
    reports.extend([retry, marker]);
    reports.push(rules::key_reuse_refused(&run).await?);
    reports.push(rules::concurrent_applied_once(&run).await?);
    reports.push(rules::missing_key(&run).await?);
    reports.push(rules::failure_not_stored(&run).await?);
    reports.push(rules::ambiguous_5xx_applied_once(&run).await?);
    reports.push(rules::malformed_keys_refused(&run).await?);
    reports.push(rules::principals_kept_apart(&run).await?);
    Ok(Report {
        target: format!("{} {}", config.method, config.url),
        mode: config.expect,
        effects_counted: config.effects.is_some(),
        rules: reports,
    })
}
