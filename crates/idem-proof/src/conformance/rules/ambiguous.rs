//! `ambiguous-5xx-applied-once`: a request the server applied and then
//! answered 5xx (an application that crashed after its commit, a load
//! balancer that gave up on a slow answer) is not applied again by its
//! retry. The 5xx says nothing about whether the effect happened, so a
//! server that releases the key on it lets the retry charge twice. The
//! retry may get the outcome (2xx, ideally a replay the server reconciled by
//! asking its upstream), or be told to wait while the key is held (409 or
//! 503 with `Retry-After`); it must not run again.
//!
//! The server is made to apply and then fail on purpose, by a header
//! (`--apply-then-fail-header`) or a path (`--apply-then-fail-path`); only
//! the effect count tells a second application from a replay, so the rule
//! also needs one. Without either it is skipped.

use super::super::client::Exchange;
use super::super::effects::EffectsError;
use super::super::report::{Outcome, RuleReport};
use super::{Finding, Run};

const ASKS: &str = "a request applied and then answered 5xx is not applied again by its retry: the retry gets the outcome (2xx) or is told to wait (409 or 503 with Retry-After)";

pub(crate) async fn ambiguous_5xx_applied_once(run: &Run<'_>) -> Result<RuleReport, EffectsError> {
    let mut finding = Finding::new("ambiguous-5xx-applied-once", ASKS);
    let Some(trigger) = &run.config.apply_then_fail else {
        return Ok(finding.end(
            Outcome::Skipped,
            "needs --apply-then-fail-header or --apply-then-fail-path: a request the server applies and then answers 5xx to",
        ));
    };
    if run.config.effects.is_none() {
        return Ok(finding.end(
            Outcome::Skipped,
            "needs --effects-url or --effects-query: only the effect count tells a retry applied again from one answered with the outcome",
        ));
    }
    let key = run.key("ambiguous", 1);
    let body = run.body();
    let before = run.count().await?;
    let (failing, retry) = run.triggered(trigger, &key, &body);
    let failed = finding.saw(run.send(failing).await);
    let applied_first = run.applied_since(before).await?;
    let retried = finding.saw(run.send(retry).await);
    let applied = run.applied_since(before).await?;
    finding.counted(applied, 1);
    let answers = format!(
        "request through the hook {}, retry {}",
        failed.status_text(),
        retried.status_text()
    );
    let report = match (applied_first, applied) {
        (Some(n), _) if n > 1 => finding.end(
            Outcome::Fail,
            format!("{answers}: the request through the hook alone was applied {n} times"),
        ),
        (_, Some(n)) if n > 1 => finding.end(
            Outcome::Fail,
            format!(
                "{answers}: the retry was applied again, {n} effects for one operation; a 5xx after the effect must not free the key"
            ),
        ),
        _ if !is_5xx(&failed) => finding.end(
            Outcome::Fail,
            format!(
                "{answers}: the hook did not make the server answer 5xx; check --apply-then-fail-header or --apply-then-fail-path"
            ),
        ),
        (Some(0), _) => finding.end(
            Outcome::Fail,
            format!(
                "{answers}: the request through the hook was not applied (0 effects), so nothing ambiguous was tested; the hook must apply the request before answering 5xx"
            ),
        ),
        _ if retried.succeeded() => {
            let how = match (retried.replayed, retried.reconciled) {
                (true, true) => ", reconciled with the upstream and replayed",
                (true, false) => ", replayed",
                _ => "",
            };
            finding.end(
                Outcome::Pass,
                format!("{answers}: applied once; the retry got the outcome{how}"),
            )
        }
        _ if held(&retried) => finding.end(
            Outcome::Pass,
            format!(
                "{answers}: applied once; the key is held (Retry-After: {}) until the outcome is known",
                retried.retry_after.as_deref().unwrap_or_default()
            ),
        ),
        _ => finding.end(
            Outcome::Unproven,
            format!(
                "{answers}: applied once, but the retry neither got the outcome (2xx) nor was told to wait (409 or 503 with Retry-After)"
            ),
        ),
    };
    Ok(report)
}

fn is_5xx(exchange: &Exchange) -> bool {
    exchange.status.is_some_and(|s| (500..600).contains(&s))
}

/// A refusal that says the key is taken and when to come back.
fn held(exchange: &Exchange) -> bool {
    matches!(exchange.status, Some(409 | 503)) && exchange.retry_after.is_some()
}
