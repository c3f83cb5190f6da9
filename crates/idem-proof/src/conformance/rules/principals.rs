//! `principals-kept-apart`: keys are scoped by who sends them. The same key
//! and body from two principals are two operations, each applied once and
//! each replayed only to its own principal. Run when `--principal-header`
//! is given.

use http::HeaderValue;

use super::super::effects::EffectsError;
use super::super::report::{Outcome, RuleReport};
use super::{Finding, Run};

const ASKS: &str = "the same key from two principals is applied once for each, and each retry is replayed to its own principal";

pub(crate) async fn principals_kept_apart(run: &Run<'_>) -> Result<RuleReport, EffectsError> {
    let mut finding = Finding::new("principals-kept-apart", ASKS);
    let Some((header, [a, b])) = &run.config.principals else {
        return Ok(finding.end(
            Outcome::Skipped,
            "needs --principal-header: the header that tells callers apart",
        ));
    };
    let key = run.key("principals", 1);
    let body = run.body();
    let send = |who: &HeaderValue, label: &str| {
        let mut outgoing = run.keyed(&key, &body);
        outgoing.principal = Some((header.clone(), who.clone()));
        let shown = format!("{header}: principal {label}");
        async move {
            let mut exchange = run.send(outgoing).await;
            exchange.principal = Some(shown);
            exchange
        }
    };
    let before = run.count().await?;
    let a1 = finding.saw(send(a, "A").await);
    let b1 = finding.saw(send(b, "B").await);
    let a2 = finding.saw(send(a, "A").await);
    let b2 = finding.saw(send(b, "B").await);
    let applied = run.applied_since(before).await?;
    finding.counted(applied, 2);
    let seen = format!(
        "principal A {}, B {}, A again {}, B again {}",
        a1.status_text(),
        b1.status_text(),
        a2.status_text(),
        b2.status_text()
    );
    if !a1.succeeded() {
        return Ok(finding.unusable(&a1));
    }
    let report = if !b1.succeeded() {
        finding.end(
            Outcome::Fail,
            format!("{seen}: the second principal's first request was refused, so the key is shared between callers"),
        )
    } else if b1.replayed || applied.is_some_and(|n| n < 2) {
        finding.end(
            Outcome::Fail,
            format!("{seen}: the second principal got the first one's answer instead of its own operation"),
        )
    } else if applied.is_some_and(|n| n > 2) {
        finding.end(
            Outcome::Fail,
            format!(
                "{seen}: {} effects for two operations",
                applied.unwrap_or_default()
            ),
        )
    } else if !a1.same_answer(&a2) || !b1.same_answer(&b2) {
        finding.end(
            Outcome::Fail,
            format!("{seen}: a retry did not get its own principal's first answer"),
        )
    } else if applied == Some(2) || !a1.same_answer(&b1) {
        finding.end(
            Outcome::Pass,
            format!("{seen}: two operations, each replayed to its own principal"),
        )
    } else {
        finding.end(
            Outcome::Unproven,
            format!("{seen}: both principals got the same bytes and effects are not counted, so a shared answer cannot be ruled out"),
        )
    };
    Ok(report)
}
