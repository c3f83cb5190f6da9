//! `missing-key`: what the endpoint does with a request without a key. Both
//! processing it and refusing it with 400 are allowed (a route may require
//! keys or not); the rule reports which, and does not judge.

use super::super::client::KeyValue;
use super::super::effects::EffectsError;
use super::super::report::{Outcome, RuleReport};
use super::{Finding, Run};

const ASKS: &str = "a request without a key is handled as documented: processed, or refused with 400 where keys are required";

pub(crate) async fn missing_key(run: &Run<'_>) -> Result<RuleReport, EffectsError> {
    let mut finding = Finding::new("missing-key", ASKS);
    let before = run.count().await?;
    let answer = finding.saw(run.send(run.request(KeyValue::None, &run.body())).await);
    let applied = run.applied_since(before).await?;
    finding.effects = applied;
    let effects = applied.map_or(String::new(), |n| format!(", {n} applied"));
    let detail = match answer.status {
        Some(400) => format!("refused with 400{effects}: this endpoint requires a key"),
        Some(_) if answer.succeeded() => {
            format!(
                "processed ({}{effects}): keys are optional here",
                answer.status_text()
            )
        }
        Some(_) => format!("answered {}{effects}", answer.status_text()),
        None => format!("no answer: {}", answer.error.clone().unwrap_or_default()),
    };
    Ok(finding.end(Outcome::Info, detail))
}
