//! The server-rendered pages: one module per subject, the layout and the
//! pieces they share here. Pages read and act through the same functions as
//! the API ([`crate::read`], [`crate::actions`]); a read-only caller's pages
//! show no action buttons, and every action asks first, on a page that says
//! what will happen.

pub(crate) mod letters;
pub(crate) mod login;
pub(crate) mod overview;
pub(crate) mod records;
pub(crate) mod set_aside;

use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Response};
use maud::{DOCTYPE, Markup, html};

use crate::access::{Caller, Credential, Role};
use crate::problem::Problem;

/// The navigation: path and label.
const NAV: [(&str, &str); 7] = [
    ("/", "Overview"),
    ("/records", "Records"),
    ("/in-flight", "In flight"),
    ("/dead-letters", "Dead letters"),
    ("/outbox", "Outbox"),
    ("/audit", "Audit log"),
    ("/auditor", "Auditor"),
];

/// A whole page: header, navigation (`here` marked), `content`.
pub(crate) fn layout(title: &str, here: &str, caller: Option<&Caller>, content: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · idem console" }
                link rel="stylesheet" href="/assets/console.css";
                script src="/assets/console.js" defer {}
            }
            body {
                header {
                    span.brand { "idem console" }
                    nav {
                        @for (path, label) in NAV {
                            a href=(path) class=[(path == here).then_some("here")] { (label) }
                        }
                        a href="/api/v1/openapi.json" { "API" }
                    }
                    @if let Some(caller) = caller {
                        span.who {
                            @match caller.role {
                                Role::Operator => "operator",
                                Role::Viewer => "read-only",
                            }
                            @if caller.credential == Credential::Cookie {
                                " · "
                                form method="post" action="/logout" {
                                    button type="submit" { "sign out" }
                                }
                            }
                        }
                    }
                }
                main { (content) }
            }
        }
    }
}

/// A page, as a response.
pub(crate) fn page(title: &str, here: &str, caller: &Caller, content: Markup) -> Response {
    Html(layout(title, here, Some(caller), content).into_string()).into_response()
}

/// A refusal or failure, as a page with the problem's status.
#[derive(Debug)]
pub(crate) struct PageError(pub(crate) Problem);

impl From<Problem> for PageError {
    fn from(problem: Problem) -> Self {
        Self(problem)
    }
}

impl From<idem::Error> for PageError {
    fn from(error: idem::Error) -> Self {
        Self(error.into())
    }
}

impl IntoResponse for PageError {
    fn into_response(self) -> Response {
        let status = self.0.status();
        let content = html! {
            h1 { (self.0.title) }
            div.error { (self.0.detail) }
            p { a href="/" { "back to the overview" } }
        };
        (
            status,
            Html(layout(&self.0.title, "", None, content).into_string()),
        )
            .into_response()
    }
}

/// What a page handler returns.
pub(crate) type PageResult = Result<Response, PageError>;

/// The hidden field every action form carries.
pub(crate) fn csrf_field(caller: &Caller) -> Markup {
    html! { input type="hidden" name="csrf" value=(caller.csrf); }
}

/// The field that asks who acts, for the audit log.
pub(crate) fn actor_field() -> Markup {
    html! {
        label {
            "your name, for the audit log "
            input type="text" name="actor" required autocomplete="name" id="actor";
        }
    }
}

/// A time cell: RFC 3339 in UTC.
pub(crate) fn time(ms: i64) -> Markup {
    html! { span.mono title=(ms) { (crate::view::time(ms)) } }
}

/// The page a finished action shows.
pub(crate) fn done(caller: &Caller, title: &str, what: Markup) -> Response {
    page(
        title,
        "",
        caller,
        html! {
            h1 { (title) }
            div.notice { (what) }
        },
    )
}

/// 404: a problem document under `/api/`, a page elsewhere.
pub(crate) async fn not_found(uri: axum::http::Uri) -> Response {
    if uri.path().starts_with("/api/") {
        return Problem::not_found("no such API path; /api/v1/openapi.json lists them")
            .into_response();
    }
    PageError(Problem::new(
        StatusCode::NOT_FOUND,
        "no such page; the navigation above lists them",
    ))
    .into_response()
}
