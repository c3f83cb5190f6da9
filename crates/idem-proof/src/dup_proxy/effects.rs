//! Reading the upstream's effect count (`--effects-url`), and the window a
//! duplicated pair is measured in.
//!
//! # Why a window around the second send
//!
//! The count is global: it moves with every request, not only the pair's.
//! When the copy goes after the original's answer (`--delay`) or ahead of it
//! (`--reorder`), the two sends do not overlap, and the second one — of a
//! request that was already applied — must cause no effect on an idempotent
//! path. So the count is read just before the second send and just after its
//! answer, and the difference is that pair's *extra* effects. Windows of two
//! pairs never overlap (they take turns), and every other request through the
//! proxy waits while a window is open, so a pair is charged with its copy's
//! effects only. Effects caused by anything that does not pass through the
//! proxy (a job, another client) are still charged to the window they fall
//! in: measure on a quiet staging system, or read the extra effects as an
//! upper bound.
//!
//! When the copy goes at the same time as the original (the default), the
//! two effects cannot be told apart, so no pair is measured: the report gives
//! the count at the start and now, for a comparison with the number of
//! requests by hand.

use serde_json::Value;

use super::config::EffectsUrl;
use super::send::{Reply, Sender};

/// Reads the count: a JSON number, or an object with a numeric `count`.
pub(crate) async fn read(sender: &Sender, url: &EffectsUrl) -> Result<u64, String> {
    let body = match sender.get(url.uri()).await {
        Reply::Whole(parts, body) if parts.status.is_success() => body,
        Reply::Whole(parts, _) => return Err(format!("{url} answered {}", parts.status)),
        Reply::Streaming(response) => {
            return Err(format!("{url} answered {}", response.status()));
        }
        Reply::Failed(failure) => return Err(format!("{url}: {failure}")),
    };
    let value: Value = serde_json::from_slice(&body)
        .map_err(|error| format!("{url} did not answer JSON: {error}"))?;
    let count = match &value {
        Value::Object(object) => object.get("count"),
        other => Some(other),
    };
    count.and_then(Value::as_u64).ok_or_else(|| {
        format!("{url} answered {value}, not a count: answer a number or {{\"count\": N}}")
    })
}
