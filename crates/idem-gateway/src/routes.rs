//! [`RouteTemplates`]: the gateway's route templates (`--routes`), which name
//! a request's route in the metrics' `route` label. The gateway cannot see
//! the upstream's router, so it is told the templates; a path that matches
//! none is labelled with its first segment. Either way the number of labels
//! stays bounded, whatever paths clients send.

use std::sync::Arc;

use http::Method;

use idem_http::observe::first_segment_label;

/// Route templates: `/payments/{id}` (a `{name}` segment matches any one
/// segment), `/files/{*path}` (the last segment may match the rest of the
/// path, at least one segment), `/orders` (literal segments).
#[derive(Debug, Clone, Default)]
pub(crate) struct RouteTemplates {
    templates: Vec<(Arc<str>, Vec<Segment>)>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Segment {
    Literal(String),
    One,
    Rest,
}

impl RouteTemplates {
    pub(crate) fn new(templates: &[String]) -> Self {
        let templates = templates
            .iter()
            .map(|template| {
                let segments = segments(template)
                    .map(|segment| match segment.strip_prefix('{') {
                        Some(name) if name.starts_with('*') && name.ends_with('}') => Segment::Rest,
                        Some(name) if name.ends_with('}') => Segment::One,
                        _ => Segment::Literal(segment.to_owned()),
                    })
                    .collect();
                (Arc::from(template.as_str()), segments)
            })
            .collect();
        Self { templates }
    }

    /// `METHOD template` for the first template `path` matches, else
    /// `METHOD /first-segment`.
    pub(crate) fn label(&self, method: &Method, path: &str) -> String {
        match self.matching(path) {
            Some(template) => format!("{method} {template}"),
            None => first_segment_label(method, path),
        }
    }

    fn matching(&self, path: &str) -> Option<&str> {
        self.templates
            .iter()
            .find(|(_, template)| matches(template, path))
            .map(|(text, _)| &**text)
    }
}

fn matches(template: &[Segment], path: &str) -> bool {
    let mut path = segments(path);
    for segment in template {
        match (segment, path.next()) {
            (_, None) => return false,
            (Segment::Rest, Some(_)) => return true,
            (Segment::One, Some(_)) => {}
            (Segment::Literal(literal), Some(actual)) if literal == actual => {}
            (Segment::Literal(_), Some(_)) => return false,
        }
    }
    path.next().is_none()
}

fn segments(path: &str) -> impl Iterator<Item = &str> {
    path.split('/').filter(|segment| !segment.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_matching_template_names_the_route() {
        let routes = RouteTemplates::new(&[
            "/payments/{id}".to_owned(),
            "/payments/{id}/refunds".to_owned(),
            "/orders".to_owned(),
            "/files/{*path}".to_owned(),
        ]);
        for (method, path, label) in [
            (Method::PUT, "/payments/42", "PUT /payments/{id}"),
            (
                Method::POST,
                "/payments/42/refunds",
                "POST /payments/{id}/refunds",
            ),
            (Method::POST, "/orders", "POST /orders"),
            (Method::POST, "/orders/", "POST /orders"),
            (Method::PUT, "/files/a/b/c", "PUT /files/{*path}"),
            // No template: the first segment.
            (Method::POST, "/orders/7/items", "POST /orders"),
            (Method::DELETE, "/payments", "DELETE /payments"),
            (Method::PUT, "/files", "PUT /files"),
        ] {
            assert_eq!(routes.label(&method, path), label, "{method} {path}");
        }
        let none = RouteTemplates::default();
        assert_eq!(none.label(&Method::PUT, "/payments/42"), "PUT /payments");
    }
}
