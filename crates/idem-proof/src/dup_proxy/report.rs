//! The report: per route, how many requests were forwarded, how many were
//! sent twice, and how the copies were answered — with a verdict on the
//! route and a key to look up.

use std::collections::BTreeMap;
use std::sync::Mutex;

use serde::Serialize;

use super::verdict::Verdict;

/// What the proxy found, per route.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct Report {
    /// One entry per route, in the order of their names.
    pub routes: Vec<RouteReport>,
    /// The upstream's effect count, when an effects URL was given.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub effects: Option<EffectCount>,
}

/// One route's line of the [`Report`].
#[derive(Debug, Clone, Default, Serialize)]
#[non_exhaustive]
pub struct RouteReport {
    /// Method and path, identifiers written `{id}`: `POST /orders/{id}`.
    pub route: String,
    /// What the copies say about the route.
    pub verdict: RouteVerdict,
    /// Requests forwarded.
    pub requests: u64,
    /// Requests sent twice.
    pub duplicated: u64,
    /// Copies answered with the same status and body.
    pub same: u64,
    /// Copies answered as replays (`Idempotent-Replayed: true`).
    pub replayed: u64,
    /// Copies refused by an idempotency layer (409 in flight, 422 reused).
    pub refused: u64,
    /// Copies answered differently: the tell of a non-idempotent path.
    pub different: u64,
    /// Pairs where one send got no answer.
    pub no_answer: u64,
    /// Requests whose body was too large to send twice (sent once).
    pub too_large: u64,
    /// Effects counted during the second sends of this route's pairs, when
    /// they were measured.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub extra_effects: Option<u64>,
    /// The key of a pair answered differently (else of any pair).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub example_key: Option<String>,
}

/// What the copies say about a route.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RouteVerdict {
    /// A copy was answered differently, or caused extra effects.
    NotIdempotent,
    /// Every compared copy was answered the same, replayed or refused.
    Idempotent,
    /// No pair got two answers to compare (yet).
    #[default]
    Untested,
}

/// The upstream's effect count at the start and when the report was made.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct EffectCount {
    /// Read when the proxy started.
    pub at_start: Option<u64>,
    /// Read for this report.
    pub now: Option<u64>,
    /// Whether the pairs' extra effects were measured (not when the copies go
    /// concurrently with the originals).
    pub per_pair: bool,
}

/// The running counts behind the report.
#[derive(Debug, Default)]
pub(crate) struct Tally {
    routes: Mutex<BTreeMap<String, RouteReport>>,
}

impl Tally {
    fn with(&self, route: &str, change: impl FnOnce(&mut RouteReport)) {
        let mut routes = self
            .routes
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let entry = routes
            .entry(route.to_owned())
            .or_insert_with(|| RouteReport {
                route: route.to_owned(),
                ..RouteReport::default()
            });
        change(entry);
    }

    /// A request was forwarded; `too_large` when its body was streamed.
    pub(crate) fn forwarded(&self, route: &str, too_large: bool) {
        self.with(route, |r| {
            r.requests += 1;
            r.too_large += u64::from(too_large);
        });
    }

    /// A request was picked to be sent twice.
    pub(crate) fn duplicated(&self, route: &str) {
        self.with(route, |r| r.duplicated += 1);
    }

    /// A pair was compared; `extra_effects` when its window was measured.
    pub(crate) fn compared(
        &self,
        route: &str,
        key: Option<&str>,
        verdict: Verdict,
        extra_effects: Option<u64>,
    ) {
        self.with(route, |r| {
            match verdict {
                Verdict::Same => r.same += 1,
                Verdict::Replayed => r.replayed += 1,
                Verdict::Refused => r.refused += 1,
                Verdict::Different => r.different += 1,
                Verdict::NoAnswer => r.no_answer += 1,
            }
            if let Some(extra) = extra_effects {
                *r.extra_effects.get_or_insert(0) += extra;
            }
            let notable = verdict == Verdict::Different || extra_effects.is_some_and(|e| e > 0);
            if let Some(key) = key
                && (r.example_key.is_none()
                    || (notable && r.verdict != RouteVerdict::NotIdempotent))
            {
                r.example_key = Some(key.to_owned());
            }
            r.verdict = if r.different > 0 || r.extra_effects.is_some_and(|e| e > 0) {
                RouteVerdict::NotIdempotent
            } else if r.same + r.replayed + r.refused > 0 {
                RouteVerdict::Idempotent
            } else {
                RouteVerdict::Untested
            };
        });
    }

    /// The routes as they stand.
    pub(crate) fn routes(&self) -> Vec<RouteReport> {
        self.routes
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .values()
            .cloned()
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_different_copy_makes_a_route_not_idempotent_and_names_its_key() {
        let tally = Tally::default();
        for (key, verdict) in [
            ("k-1", Verdict::Same),
            ("k-2", Verdict::Different),
            ("k-3", Verdict::Same),
        ] {
            tally.forwarded("POST /orders", false);
            tally.duplicated("POST /orders");
            tally.compared("POST /orders", Some(key), verdict, None);
        }
        tally.forwarded("GET /orders", true);
        let routes = tally.routes();
        let get = &routes[0];
        assert_eq!(
            (get.requests, get.too_large, get.verdict),
            (1, 1, RouteVerdict::Untested)
        );
        let post = &routes[1];
        assert_eq!(post.verdict, RouteVerdict::NotIdempotent);
        assert_eq!((post.duplicated, post.same, post.different), (3, 2, 1));
        assert_eq!(post.example_key.as_deref(), Some("k-2"));
    }

    #[test]
    fn extra_effects_alone_make_a_route_not_idempotent() {
        let tally = Tally::default();
        tally.compared("POST /pay", Some("a"), Verdict::Same, Some(0));
        assert_eq!(tally.routes()[0].verdict, RouteVerdict::Idempotent);
        tally.compared("POST /pay", Some("b"), Verdict::Same, Some(1));
        let route = &tally.routes()[0];
        assert_eq!(route.verdict, RouteVerdict::NotIdempotent);
        assert_eq!(route.extra_effects, Some(1));
        assert_eq!(route.example_key.as_deref(), Some("b"));
    }
}
