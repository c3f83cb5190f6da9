//! `key-reuse-refused`: the same key with another body is the caller's
//! error, not a retry: it is refused (422 in the IETF draft, 400 at Stripe)
//! and nothing of it is applied.

use super::super::effects::EffectsError;
use super::super::report::{Outcome, RuleReport};
use super::{Finding, Run};

const ASKS: &str =
    "a key reused with another body is refused (IETF 422, Stripe 400) and not applied";

pub(crate) async fn key_reuse_refused(run: &Run<'_>) -> Result<RuleReport, EffectsError> {
    let mut finding = Finding::new("key-reuse-refused", ASKS);
    let key = run.key("reuse", 1);
    let before = run.count().await?;
    let first = finding.saw(run.send(run.keyed(&key, &run.body())).await);
    if !first.succeeded() {
        return Ok(finding.unusable(&first));
    }
    let other = finding.saw(run.send(run.keyed(&key, &run.body())).await);
    let applied = run.applied_since(before).await?;
    finding.counted(applied, 1);

    let wanted = run.config.expect.reuse_statuses();
    let wanted_text = wanted
        .iter()
        .map(u16::to_string)
        .collect::<Vec<_>>()
        .join(" or ");
    let answers = format!(
        "first {}, other body {}",
        first.status_text(),
        other.status_text()
    );
    let report = match other.status {
        _ if applied.is_some_and(|n| n > 1) => finding.end(
            Outcome::Fail,
            format!(
                "{answers}: the other body was applied too ({} effects)",
                applied.unwrap_or_default()
            ),
        ),
        Some(status) if wanted.contains(&status) => {
            finding.end(Outcome::Pass, format!("{answers}: refused, nothing applied"))
        }
        Some(400 | 422) => finding.end(
            Outcome::Fail,
            format!(
                "{answers}: refused, but with {} where --mode {} wants {wanted_text}",
                other.status_text(),
                run.config.expect
            ),
        ),
        Some(_) if other.succeeded() && first.same_answer(&other) => finding.end(
            Outcome::Fail,
            format!("{answers}: the first answer was replayed to another body; the key is not bound to what it was made for"),
        ),
        Some(_) if other.succeeded() => finding.end(
            Outcome::Fail,
            format!("{answers}: the other body was accepted as a new request"),
        ),
        _ => finding.end(
            Outcome::Fail,
            format!("{answers}: wanted {wanted_text}"),
        ),
    };
    Ok(report)
}
