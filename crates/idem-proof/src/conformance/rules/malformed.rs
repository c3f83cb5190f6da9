//! `malformed-keys-refused`: a key must be 1 to 255 visible ASCII
//! characters; an empty, too long, non-ASCII or control-character key is
//! refused with 400 and nothing is applied.

use super::super::client::KeyValue;
use super::super::effects::EffectsError;
use super::super::report::{Outcome, RuleReport};
use super::{Finding, Run};

const ASKS: &str = "malformed keys (empty, over 255 characters, non-ASCII, control characters) are refused with 400 and not applied";

pub(crate) async fn malformed_keys_refused(run: &Run<'_>) -> Result<RuleReport, EffectsError> {
    let mut finding = Finding::new("malformed-keys-refused", ASKS);
    let prefix = run.key("malformed", 1);
    let long = format!("{prefix}-{}", "x".repeat(256));
    let cases = [
        ("empty", KeyValue::Raw(Vec::new())),
        ("256+ characters", KeyValue::Key(long)),
        ("non-ASCII", KeyValue::Key(format!("{prefix}-clé"))),
        ("control character", KeyValue::Key(format!("{prefix}\tx"))),
    ];
    let before = run.count().await?;
    let mut seen = Vec::new();
    let mut accepted = Vec::new();
    for (case, key) in cases {
        let exchange = finding.saw(run.send(run.request(key, &run.body())).await);
        seen.push(format!("{case} {}", exchange.status_text()));
        if exchange.status != Some(400) {
            accepted.push(case);
        }
    }
    let applied = run.applied_since(before).await?;
    finding.counted(applied, 0);
    let seen = seen.join(", ");
    let report = if !accepted.is_empty() {
        let applied = applied.map_or(String::new(), |n| format!("; {n} applied"));
        finding.end(
            Outcome::Fail,
            format!(
                "{seen}: not refused with 400: {}{applied}",
                accepted.join(", ")
            ),
        )
    } else if applied.is_some_and(|n| n > 0) {
        finding.end(
            Outcome::Fail,
            format!("{seen}, yet {} applied", applied.unwrap_or_default()),
        )
    } else {
        finding.end(Outcome::Pass, seen)
    };
    Ok(report)
}
