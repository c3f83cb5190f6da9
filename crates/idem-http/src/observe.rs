//! The protocol's counters for HTTP requests, labelled with the request's
//! route so that one handler whose duplicates stop being suppressed shows up
//! on its own.
//!
//! The stores count duplicates, conflicts and reused keys of every other
//! scope family (consumers, the outbox); for HTTP scopes they leave the count
//! to this module, which knows the route: [`DUPLICATES_SUPPRESSED_TOTAL`],
//! [`KEY_CONFLICTS_TOTAL`] and [`KEY_REUSE_TOTAL`], each with
//! `scope="http"` and `route`.
//!
//! The `route` label is `METHOD template`, bounded whatever the clients send:
//!
//! - the gateway's: the first of its configured route templates that matches
//!   the path (`PUT /payments/{id}`);
//! - in an axum router: the matched route template, axum's `MatchedPath`
//!   (`PUT /payments/{id}`);
//! - otherwise the first path segment (`PUT /payments` for
//!   `/payments/42/refunds`), `{id}` when it looks like an identifier, and
//!   `{other}` once [`MAX_SEGMENT_LABELS`] segments have been seen.

use std::collections::BTreeSet;
use std::sync::{Arc, PoisonError, RwLock};

use axum::extract::MatchedPath;
use axum::response::Response;
use http::{Extensions, Method, Uri};

use crate::idempotency::problem::Refused;
use crate::stored::Replayed;

pub use idem_core::observe::{DUPLICATES_SUPPRESSED_TOTAL, KEY_CONFLICTS_TOTAL, KEY_REUSE_TOTAL};

/// How many distinct first path segments become labels; later ones are
/// labelled `{other}`, so a client probing random paths cannot grow the
/// series without bound.
pub const MAX_SEGMENT_LABELS: usize = 64;

/// A request extension naming the request's `route` label, set by a proxy
/// that matched the path against its own route templates (the gateway).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteLabel(pub Arc<str>);

/// The `route` label of a request: [`RouteLabel`] when set, else the matched
/// route template, else the first path segment.
pub(crate) fn route_label(method: &Method, uri: &Uri, extensions: &Extensions) -> String {
    if let Some(RouteLabel(label)) = extensions.get::<RouteLabel>() {
        return label.to_string();
    }
    match extensions.get::<MatchedPath>() {
        Some(matched) => format!("{method} {}", matched.as_str()),
        None => first_segment_label(method, uri.path()),
    }
}

/// The segments seen so far by [`first_segment_label`].
static SEGMENTS: RwLock<BTreeSet<String>> = RwLock::new(BTreeSet::new());

/// `METHOD /segment` for the first segment of `path`: `{id}` for an
/// identifier, `{other}` past [`MAX_SEGMENT_LABELS`] distinct segments.
pub fn first_segment_label(method: &Method, path: &str) -> String {
    label_among(&SEGMENTS, method, path)
}

/// [`first_segment_label`], with the segments seen so far in `seen`.
fn label_among(seen: &RwLock<BTreeSet<String>>, method: &Method, path: &str) -> String {
    let segment = path.split('/').find(|s| !s.is_empty()).unwrap_or("");
    let segment = if looks_like_an_id(segment) {
        "{id}"
    } else if segment.is_empty() {
        ""
    } else if seen
        .read()
        .unwrap_or_else(PoisonError::into_inner)
        .contains(segment)
    {
        segment
    } else {
        let mut seen = seen.write().unwrap_or_else(PoisonError::into_inner);
        if seen.contains(segment) || seen.len() < MAX_SEGMENT_LABELS {
            seen.insert(segment.to_owned());
            segment
        } else {
            "{other}"
        }
    };
    format!("{method} /{segment}")
}

/// A number, a UUID, or a long run of hex digits (a hash, an object id).
pub fn looks_like_an_id(segment: &str) -> bool {
    if segment.is_empty() {
        return false;
    }
    if segment.bytes().all(|b| b.is_ascii_digit()) {
        return true;
    }
    let hex_digits = segment.bytes().filter(u8::is_ascii_hexdigit).count();
    let dashes = segment.bytes().filter(|b| *b == b'-').count();
    if hex_digits + dashes != segment.len() {
        return false;
    }
    let uuid = segment.len() == 36
        && dashes == 4
        && [8, 13, 18, 23]
            .iter()
            .all(|&i| segment.as_bytes()[i] == b'-');
    let long_hex = dashes == 0 && segment.len() >= 16;
    uuid || long_hex
}

/// Counts what the answer to a keyed request on `route` says the protocol
/// did: a replay, a conflict (still in flight) or a reused key.
pub(crate) fn keyed_answer(route: &str, response: &Response) {
    let scope = idem_core::observe::HTTP_FAMILY;
    let route = route.to_owned();
    if response.extensions().get::<Replayed>().is_some() {
        metrics::counter!(DUPLICATES_SUPPRESSED_TOTAL, "scope" => scope, "route" => route)
            .increment(1);
        return;
    }
    match response.extensions().get::<Refused>() {
        Some(refused) if refused.is_in_flight() => {
            metrics::counter!(KEY_CONFLICTS_TOTAL, "scope" => scope, "route" => route).increment(1);
        }
        Some(refused) if refused.is_key_reuse() => {
            metrics::counter!(KEY_REUSE_TOTAL, "scope" => scope, "route" => route).increment(1);
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_templates_or_first_segments() {
        let uri: Uri = "/payments/42/refunds?x=1".parse().unwrap();
        let mut extensions = Extensions::new();
        assert_eq!(
            route_label(&Method::PUT, &uri, &extensions),
            "PUT /payments"
        );
        extensions.insert(RouteLabel("PUT /payments/{id}/refunds".into()));
        assert_eq!(
            route_label(&Method::PUT, &uri, &extensions),
            "PUT /payments/{id}/refunds"
        );
        assert_eq!(first_segment_label(&Method::POST, "/"), "POST /");
        assert_eq!(first_segment_label(&Method::POST, ""), "POST /");
        assert_eq!(first_segment_label(&Method::DELETE, "/42"), "DELETE /{id}");
        assert_eq!(
            first_segment_label(&Method::POST, "/8e03978e-40d5-43e8-bc93-6894a57f9324/x"),
            "POST /{id}"
        );
    }

    #[test]
    fn first_segments_are_bounded() {
        // Segments of its own: the process's set stays for the other tests.
        let seen = RwLock::new(BTreeSet::new());
        let labels: BTreeSet<String> = (0..MAX_SEGMENT_LABELS * 2)
            .map(|i| label_among(&seen, &Method::POST, &format!("/probe-{i}")))
            .collect();
        assert!(labels.len() <= MAX_SEGMENT_LABELS + 1, "{}", labels.len());
        assert!(labels.contains("POST /{other}"));
    }
}
