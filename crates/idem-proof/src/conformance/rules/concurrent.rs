//! `concurrent-applied-once`: N copies of one request sent at the same
//! moment are applied once. The copies that lose the race are refused (409,
//! the original still running) or wait for the original's answer; none is
//! applied again. A retry after the burst gets the original's answer.

use std::collections::BTreeMap;
use std::sync::Arc;

use tokio::sync::Barrier;

use super::super::effects::EffectsError;
use super::super::report::{Outcome, RuleReport};
use super::{Finding, Run};

const ASKS: &str = "concurrent duplicates (one key, sent at once) are applied once: the others are refused with 409 or wait for the original's answer";

pub(crate) async fn concurrent_applied_once(run: &Run<'_>) -> Result<RuleReport, EffectsError> {
    let mut finding = Finding::new("concurrent-applied-once", ASKS);
    let key = run.key("concurrent", 1);
    let body = run.body();
    let copies = run.config.concurrency.max(2);
    let before = run.count().await?;
    let start = Arc::new(Barrier::new(copies));
    let sends = (0..copies).map(|_| {
        let (sender, outgoing, start) = (
            run.sender.clone(),
            run.keyed(&key, &body),
            Arc::clone(&start),
        );
        tokio::spawn(async move {
            start.wait().await;
            sender.send(outgoing).await
        })
    });
    let mut burst = Vec::with_capacity(copies);
    for send in sends.collect::<Vec<_>>() {
        match send.await {
            Ok(exchange) => burst.push(finding.saw(exchange)),
            Err(error) if error.is_panic() => std::panic::resume_unwind(error.into_panic()),
            // Not cancelled: the handles are held until here.
            Err(_) => {}
        }
    }
    let after = finding.saw(run.send(run.keyed(&key, &body)).await);
    let applied = run.applied_since(before).await?;
    finding.counted(applied, 1);

    let mut statuses = BTreeMap::<String, usize>::new();
    for exchange in &burst {
        *statuses.entry(exchange.status_text()).or_default() += 1;
    }
    let seen = statuses
        .iter()
        .map(|(status, n)| format!("{n}×{status}"))
        .collect::<Vec<_>>()
        .join(", ");
    let seen = format!(
        "{copies} at once: {seen}; retry after: {}",
        after.status_text()
    );
    let successes: Vec<_> = burst.iter().filter(|e| e.succeeded()).collect();
    let refused = burst.iter().filter(|e| e.status == Some(409)).count();
    let others = burst.len() - successes.len() - refused;
    let mut bodies: Vec<_> = successes.iter().map(|e| &e.answer_bytes).collect();
    bodies.sort();
    bodies.dedup();

    let report = if applied.is_some_and(|n| n > 1) {
        finding.end(
            Outcome::Fail,
            format!("{seen}: applied {} times", applied.unwrap_or_default()),
        )
    } else if bodies.len() > 1 {
        finding.end(
            Outcome::Fail,
            format!(
                "{seen}: {} different successful answers, so the key was applied more than once",
                bodies.len()
            ),
        )
    } else if successes.is_empty() {
        finding.end(Outcome::Fail, format!("{seen}: no copy succeeded"))
    } else if others > 0 {
        finding.end(
            Outcome::Fail,
            format!("{seen}: {others} answered neither the original's answer nor 409"),
        )
    } else if !successes[0].same_answer(&after) {
        finding.end(
            Outcome::Fail,
            format!("{seen}: the retry after the burst did not get the original's answer"),
        )
    } else if applied == Some(1) {
        finding.end(Outcome::Pass, format!("{seen}: applied once"))
    } else if refused + successes.iter().filter(|e| e.replayed).count() == copies - 1 {
        finding.end(
            Outcome::Pass,
            format!("{seen}: one original, every other copy refused or marked as a replay"),
        )
    } else {
        finding.end(
            Outcome::Unproven,
            format!("{seen}: equal answers, but unmarked and without an effect count a second application cannot be ruled out"),
        )
    };
    Ok(report)
}
