//! Which requests may be sent a second time.
//!
//! The handler is idempotent, not the verb. HTTP calls PUT and DELETE
//! idempotent, but a PUT handler that appends to a history, or a DELETE that
//! cancels "the latest" order, does its effect twice when a lost answer makes
//! the client resend it. So a request is resent only when one of these holds:
//!
//! - it carries an `Idempotency-Key`, whatever its method: the receiver
//!   dedupes (a receiver that honoured keys only on POST would apply a keyed
//!   PUT twice; `idem-http` dedupes every keyed request with effects);
//! - its method is *safe* — GET, HEAD, OPTIONS, TRACE — so it changes
//!   nothing;
//! - the caller named its route with
//!   [`HttpRetryPolicy::resend_without_key`](super::HttpRetryPolicy::resend_without_key):
//!   the caller's promise that this handler tolerates a second copy.

use http::{Method, Request};

use super::key_header;

/// Routes the caller promised are idempotent without a key: a method and a
/// path template whose `{name}` segments match any one segment
/// (`/users/{id}/avatar` matches `/users/7/avatar`).
#[derive(Debug, Clone, Default)]
pub(crate) struct PromisedRoutes {
    routes: Vec<(Method, Vec<Segment>)>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Segment {
    Literal(String),
    Any,
}

impl PromisedRoutes {
    pub(crate) fn add(&mut self, method: Method, template: &str) {
        let segments = segments(template)
            .map(|segment| {
                if segment.starts_with('{') && segment.ends_with('}') {
                    Segment::Any
                } else {
                    Segment::Literal(segment.to_owned())
                }
            })
            .collect();
        self.routes.push((method, segments));
    }

    fn contains(&self, method: &Method, path: &str) -> bool {
        self.routes.iter().any(|(promised, template)| {
            promised == method && {
                let mut path = segments(path);
                template.iter().all(|segment| match (segment, path.next()) {
                    (_, None) => false,
                    (Segment::Any, Some(_)) => true,
                    (Segment::Literal(literal), Some(actual)) => literal == actual,
                }) && path.next().is_none()
            }
        })
    }
}

fn segments(path: &str) -> impl Iterator<Item = &str> {
    path.split('/').filter(|segment| !segment.is_empty())
}

/// Why a request may be resent, or `None` when it must be sent once.
pub(crate) fn resend_reason<B>(
    request: &Request<B>,
    promised: &PromisedRoutes,
) -> Option<&'static str> {
    if key_header::has_key(request) {
        Some("it carries an idempotency key")
    } else if is_safe(request.method()) {
        Some("its method is safe")
    } else if promised.contains(request.method(), request.uri().path()) {
        Some("its route was named idempotent by the caller")
    } else {
        None
    }
}

/// GET, HEAD, OPTIONS and TRACE change nothing on the server.
fn is_safe(method: &Method) -> bool {
    matches!(
        *method,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(method: Method, path: &str) -> Request<()> {
        Request::builder()
            .method(method)
            .uri(path)
            .body(())
            .unwrap()
    }

    #[test]
    fn put_and_delete_without_a_key_are_sent_once() {
        let none = PromisedRoutes::default();
        assert_eq!(
            resend_reason(&request(Method::PUT, "/users/7"), &none),
            None
        );
        assert_eq!(
            resend_reason(&request(Method::DELETE, "/orders/latest"), &none),
            None
        );
        assert_eq!(
            resend_reason(&request(Method::POST, "/charges"), &none),
            None
        );
    }

    #[test]
    fn safe_methods_are_resent() {
        let none = PromisedRoutes::default();
        for method in [Method::GET, Method::HEAD, Method::OPTIONS, Method::TRACE] {
            assert!(resend_reason(&request(method, "/x"), &none).is_some());
        }
    }

    #[test]
    fn a_named_route_matches_its_method_and_shape_only() {
        let mut promised = PromisedRoutes::default();
        promised.add(Method::PUT, "/users/{id}/avatar");
        assert!(resend_reason(&request(Method::PUT, "/users/7/avatar"), &promised).is_some());
        assert!(resend_reason(&request(Method::PUT, "/users/7/avatar?x=1"), &promised).is_some());
        assert_eq!(
            resend_reason(&request(Method::DELETE, "/users/7/avatar"), &promised),
            None
        );
        assert_eq!(
            resend_reason(&request(Method::PUT, "/users/7"), &promised),
            None
        );
        assert_eq!(
            resend_reason(&request(Method::PUT, "/users/7/avatar/old"), &promised),
            None
        );
        assert_eq!(
            resend_reason(&request(Method::PUT, "/groups/7/avatar"), &promised),
            None
        );
    }
}
