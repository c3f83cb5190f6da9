//! `failure-not-stored`: a 5xx answer is not the operation's outcome: it is
//! not stored, so a retry with the same key runs again instead of getting
//! the failure replayed. The server is made to fail on purpose, by a header
//! (`--fail-header`) or a path that fails once (`--fail-path`); without one
//! the rule is skipped.

use super::super::client::Exchange;
use super::super::effects::EffectsError;
use super::super::report::{Outcome, RuleReport};
use super::{Finding, Run};

const ASKS: &str = "a 5xx answer is not stored: a retry with the same key runs again";

pub(crate) async fn failure_not_stored(run: &Run<'_>) -> Result<RuleReport, EffectsError> {
    let mut finding = Finding::new("failure-not-stored", ASKS);
    let Some(trigger) = &run.config.fail else {
        return Ok(finding.end(
            Outcome::Skipped,
            "needs --fail-header or --fail-path: a way to make the server answer 5xx",
        ));
    };
    let key = run.key("failure", 1);
    let body = run.body();
    let before = run.count().await?;
    let (failing, retry) = run.triggered(trigger, &key, &body);
    let failed = finding.saw(run.send(failing).await);
    let retried = finding.saw(run.send(retry).await);
    let applied = run.applied_since(before).await?;
    finding.effects = applied;
    let answers = format!(
        "failing request {}, retry {}",
        failed.status_text(),
        retried.status_text()
    );
    let report = if !is_5xx(&failed) {
        finding.end(
            Outcome::Fail,
            format!("{answers}: the trigger did not make the server fail; check --fail-header or --fail-path"),
        )
    } else if retried.replayed || failed.same_answer(&retried) {
        finding.end(
            Outcome::Fail,
            format!("{answers}: the failure was stored and replayed to the retry"),
        )
    } else if retried.succeeded() {
        finding.end(Outcome::Pass, format!("{answers}: the retry ran again"))
    } else {
        finding.end(
            Outcome::Unproven,
            format!(
                "{answers}: the retry did not succeed either, so whether it ran cannot be told"
            ),
        )
    };
    Ok(report)
}

fn is_5xx(exchange: &Exchange) -> bool {
    exchange.status.is_some_and(|s| (500..600).contains(&s))
}
