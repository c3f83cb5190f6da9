//! `retry-replayed` and `replay-marker`: a sequential retry of a request
//! that succeeded gets the same status and body, and is applied once; the
//! retry may say it is a replay (`Idempotent-Replayed: true`).

use super::super::effects::EffectsError;
use super::super::report::{Outcome, RuleReport};
use super::{Finding, Run};

const RETRY: &str =
    "a sequential retry is answered with the first answer's status and body, and applied once";
const MARKER: &str = "a replayed answer says so with Idempotent-Replayed: true";

/// Both rules: they read the same two exchanges.
pub(crate) async fn retry_replayed(run: &Run<'_>) -> Result<[RuleReport; 2], EffectsError> {
    let mut finding = Finding::new("retry-replayed", RETRY);
    let mut marker = Finding::new("replay-marker", MARKER);
    let key = run.key("retry", 1);
    let body = run.body();
    let before = run.count().await?;
    let first = finding.saw(run.send(run.keyed(&key, &body)).await);
    if !first.succeeded() {
        let detail = "not tested: the first request did not succeed";
        return Ok([
            finding.unusable(&first),
            marker.end(Outcome::Skipped, detail),
        ]);
    }
    let retry = finding.saw(run.send(run.keyed(&key, &body)).await);
    // The marker rule judges the same retry: it is shown there too.
    marker.saw(retry.clone());
    let applied = run.applied_since(before).await?;
    finding.counted(applied, 1);

    let answers = format!(
        "first {}, retry {}",
        first.status_text(),
        retry.status_text()
    );
    let same = first.same_answer(&retry);
    let retry_report = if !same {
        let how = if retry.status == first.status {
            "the same status with another body"
        } else {
            "another status"
        };
        let applied = applied.map_or(String::new(), |n| {
            format!("; {n} effects for one operation")
        });
        finding.end(
            Outcome::Fail,
            format!("{answers}: the retry got {how}, handled as a new request{applied}"),
        )
    } else if applied.is_some_and(|n| n != 1) {
        let n = applied.unwrap_or_default();
        finding.end(
            Outcome::Fail,
            format!("{answers}, the same body, but {n} effects for one operation"),
        )
    } else if applied == Some(1) {
        finding.end(
            Outcome::Pass,
            format!("{answers}, byte for byte; applied once"),
        )
    } else if retry.replayed {
        finding.end(
            Outcome::Pass,
            format!("{answers}, byte for byte, marked as a replay"),
        )
    } else {
        finding.end(
            Outcome::Unproven,
            format!(
                "{answers}, byte for byte, but unmarked and without an effect count this cannot be told from a second application"
            ),
        )
    };
    let marker_report = if retry.replayed && same {
        marker.end(Outcome::Pass, "the retry carried Idempotent-Replayed: true")
    } else if retry.replayed {
        marker.end(
            Outcome::Fail,
            "the retry carried Idempotent-Replayed: true, but its answer is not the first one",
        )
    } else {
        marker.end(
            Outcome::Info,
            "the retry carried no Idempotent-Replayed header (optional; clients cannot tell a replay apart)",
        )
    };
    Ok([retry_report, marker_report])
}
