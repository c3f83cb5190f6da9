//! Who may read the console and who may act on the store.
//!
//! - **Where it listens.** On a loopback address without tokens, the console
//!   is open to the host's own users, who could reach the store anyway. Any
//!   other address needs a token: [`Access::check_listen`] refuses to start
//!   without one.
//! - **Tokens.** An operator token may read and act; a read-only token may
//!   read: its pages show no action buttons and its actions are refused
//!   (403). A client sends `Authorization: Bearer <token>`; a browser signs
//!   in once at `/login`, which keeps the token in an `HttpOnly`,
//!   `SameSite=Strict` cookie.
//! - **Actions** are POSTs, and a POST must come from the console's own
//!   pages: a form carries the value of the `idem_console_csrf` cookie in its
//!   `csrf` field (a page of another site can neither read that cookie nor
//!   set it), the API's POSTs take JSON only (which another site's page
//!   cannot send without the CORS consent this server never gives), and a
//!   request whose `Origin` names another host is refused. A request that
//!   carries its token in the `Authorization` header is not a browser's
//!   ambient credential and needs no CSRF token.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};
use idem_http::admin::AdminToken;

use crate::Shared;
use crate::problem::Problem;

/// The cookie a browser keeps its token in after `/login`.
pub const TOKEN_COOKIE: &str = "idem_console_token";
/// The cookie whose value each form sends back in its `csrf` field.
pub const CSRF_COOKIE: &str = "idem_console_csrf";

/// What a caller may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Read and act (evict, end a claim, redrive).
    Operator,
    /// Read only.
    Viewer,
}

/// The console would be open to other hosts without a token.
#[derive(Debug, thiserror::Error)]
#[error(
    "the console on {addr} would let anyone who can reach that address read the store and evict keys: give a token file (--token-file FILE, and --read-only-token-file FILE for viewers), or listen on a loopback address such as 127.0.0.1:{port}",
    port = addr.port()
)]
pub struct TokenRequired {
    /// The address asked for.
    pub addr: SocketAddr,
}

/// The tokens the console accepts.
#[derive(Debug, Clone, Default)]
pub struct Access {
    operator: Option<AdminToken>,
    viewer: Option<AdminToken>,
}

impl Access {
    /// No tokens: for a loopback address only.
    pub fn open() -> Self {
        Self::default()
    }

    /// An operator token (read and act) and a read-only token, either optional.
    pub fn with_tokens(operator: Option<AdminToken>, viewer: Option<AdminToken>) -> Self {
        Self { operator, viewer }
    }

    /// Whether callers must show a token.
    pub fn needs_token(&self) -> bool {
        self.operator.is_some() || self.viewer.is_some()
    }

    /// Refuses an address other hosts can reach when no token is set.
    pub fn check_listen(&self, addr: SocketAddr) -> Result<(), TokenRequired> {
        if self.needs_token() || addr.ip().is_loopback() {
            Ok(())
        } else {
            Err(TokenRequired { addr })
        }
    }

    fn role_of(&self, token: &str) -> Option<Role> {
        if self.operator.as_ref().is_some_and(|t| t.is(token)) {
            Some(Role::Operator)
        } else if self.viewer.as_ref().is_some_and(|t| t.is(token)) {
            Some(Role::Viewer)
        } else {
            None
        }
    }

    /// Whether `token` is one of the console's tokens.
    pub(crate) fn knows(&self, token: &str) -> bool {
        self.role_of(token).is_some()
    }
}

/// How a caller showed who it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Credential {
    /// No tokens are set (loopback): nothing to show.
    None,
    /// `Authorization: Bearer`.
    Header,
    /// The cookie `/login` set.
    Cookie,
}

/// The caller of a request, as the access check found it; handlers read it
/// from the request's extensions.
#[derive(Debug, Clone)]
pub struct Caller {
    /// What it may do.
    pub role: Role,
    /// How it showed it.
    pub credential: Credential,
    /// The value forms must send back in their `csrf` field.
    pub csrf: String,
    /// Where the request came from, when the server knows.
    pub peer: Option<IpAddr>,
}

impl Caller {
    /// Whether it may act.
    pub fn may_act(&self) -> bool {
        self.role == Role::Operator
    }

    /// Who did an action, for the audit log: the name the operator gave,
    /// then how it reached the console. `Err` says what is wrong with the name.
    pub fn actor(&self, name: &str) -> Result<String, Problem> {
        let name = name.trim();
        if name.is_empty() {
            return Err(Problem::bad_request(
                "say who you are (the actor field): the audit log keeps who did each action",
            ));
        }
        if name.chars().count() > 100 || name.chars().any(char::is_control) {
            return Err(Problem::bad_request(
                "the actor is a name of at most 100 characters without control characters",
            ));
        }
        let via = match self.credential {
            Credential::None => "console",
            Credential::Header | Credential::Cookie => "console, operator token",
        };
        Ok(match self.peer {
            Some(ip) => format!("{name} ({via}, from {ip})"),
            None => format!("{name} ({via})"),
        })
    }
}

/// The value of cookie `name` in `headers`.
pub(crate) fn cookie<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(key, _)| *key == name)
        .map(|(_, value)| value.trim())
}

/// Paths open to everyone: the sign-in page, the stylesheet and script, and
/// the API's description.
fn is_public(path: &str) -> bool {
    path == "/login" || path.starts_with("/assets/") || path == "/api/v1/openapi.json"
}

fn is_api(path: &str) -> bool {
    path.starts_with("/api/")
}

/// The refusal of a request, as a problem for the API and as text for pages.
fn refuse(api: bool, status: StatusCode, detail: &str) -> Response {
    if api {
        Problem::new(status, detail).into_response()
    } else {
        (status, format!("{detail}\n")).into_response()
    }
}

/// Whether the `Origin` of `headers`, if any, is the host the request was
/// sent to.
fn same_origin(headers: &HeaderMap) -> bool {
    let Some(origin) = headers.get(header::ORIGIN).and_then(|v| v.to_str().ok()) else {
        return true;
    };
    let Some(host) = headers.get(header::HOST).and_then(|v| v.to_str().ok()) else {
        return false;
    };
    let authority = origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"))
        .unwrap_or("");
    authority.eq_ignore_ascii_case(host)
}

/// A fresh CSRF cookie value.
fn new_csrf() -> String {
    let bytes: [u8; 16] = rand::random();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The largest form an action takes.
const FORM_LIMIT: usize = 64 * 1024;

/// Middleware: finds the [`Caller`], refuses those without a token where
/// one is needed, refuses actions of read-only callers and POSTs that do
/// not come from the console's pages, and hands out the CSRF cookie.
pub(crate) async fn check(
    State(shared): State<Arc<Shared>>,
    mut request: Request,
    next: Next,
) -> Response {
    let path = request.uri().path().to_owned();
    let api = is_api(&path);
    if is_public(&path) {
        return next.run(request).await;
    }
    let headers = request.headers();
    let access = &shared.access;
    let found = if !access.needs_token() {
        Some((Role::Operator, Credential::None))
    } else if let Some(value) = headers.get(header::AUTHORIZATION) {
        value
            .to_str()
            .ok()
            .and_then(|value| {
                let (scheme, token) = value.trim().split_once(' ')?;
                scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
            })
            .and_then(|token| access.role_of(token))
            .map(|role| (role, Credential::Header))
    } else {
        cookie(headers, TOKEN_COOKIE)
            .and_then(decode)
            .and_then(|token| access.role_of(&token))
            .map(|role| (role, Credential::Cookie))
    };
    let Some((role, credential)) = found else {
        if api {
            return refuse(
                true,
                StatusCode::UNAUTHORIZED,
                "this console needs a token: send Authorization: Bearer <token>",
            );
        }
        return Redirect::to(&format!("/login?next={}", encode(&path))).into_response();
    };
    let given_csrf = cookie(headers, CSRF_COOKIE)
        .filter(|v| !v.is_empty())
        .map(str::to_owned);
    let csrf = given_csrf.clone().unwrap_or_else(new_csrf);
    let peer = request
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|info| info.0.ip());
    let caller = Caller {
        role,
        credential,
        csrf: csrf.clone(),
        peer,
    };

    // Every action is a POST; other methods reach no handler that changes anything.
    if request.method() == Method::POST && path != "/login" {
        if !same_origin(request.headers()) {
            return refuse(
                api,
                StatusCode::FORBIDDEN,
                "refused: the request comes from a page of another site (its Origin is not this console)",
            );
        }
        if path == "/logout" {
            // Signing out needs no more than the origin check.
        } else if !caller.may_act() {
            return refuse(
                api,
                StatusCode::FORBIDDEN,
                "refused: a read-only token may read the console but not change the store; sign in with the operator token to act",
            );
        } else if credential != Credential::Header {
            let (parts, body) = request.into_parts();
            let bytes = match axum::body::to_bytes(body, FORM_LIMIT).await {
                Ok(bytes) => bytes,
                Err(_) => {
                    return refuse(
                        api,
                        StatusCode::PAYLOAD_TOO_LARGE,
                        "the request body is larger than an action takes (64 KiB)",
                    );
                }
            };
            if api {
                let json = parts
                    .headers
                    .get(header::CONTENT_TYPE)
                    .and_then(|v| v.to_str().ok())
                    .is_some_and(|v| v.starts_with("application/json"));
                if !json {
                    return refuse(
                        true,
                        StatusCode::UNSUPPORTED_MEDIA_TYPE,
                        "the API's actions take Content-Type: application/json",
                    );
                }
            } else {
                let sent = form_field(&bytes, "csrf");
                let matches = match (&given_csrf, &sent) {
                    (Some(cookie), Some(sent)) => {
                        blake3::hash(cookie.as_bytes()) == blake3::hash(sent.as_bytes())
                    }
                    _ => false,
                };
                if !matches {
                    return refuse(
                        false,
                        StatusCode::FORBIDDEN,
                        "refused: the form did not carry this browser's CSRF token; open the page again and submit it from there",
                    );
                }
            }
            request = Request::from_parts(parts, Body::from(bytes));
        }
    }

    request.extensions_mut().insert(caller);
    let mut response = next.run(request).await;
    if given_csrf.is_none()
        && let Ok(value) = HeaderValue::from_str(&format!(
            "{CSRF_COOKIE}={csrf}; Path=/; HttpOnly; SameSite=Strict"
        ))
    {
        response.headers_mut().append(header::SET_COOKIE, value);
    }
    response
}

/// The first value of field `name` in a URL-encoded form.
fn form_field(body: &[u8], name: &str) -> Option<String> {
    serde_urlencoded::from_bytes::<Vec<(String, String)>>(body)
        .ok()?
        .into_iter()
        .find(|(key, _)| key == name)
        .map(|(_, value)| value)
}

/// `text` percent-encoded for a query value.
pub(crate) fn encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-_.~/".contains(&byte) {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// `text` with its percent-escapes decoded; `None` when they are not UTF-8.
fn decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && let Some(byte) = text
                .get(i + 1..i + 3)
                .and_then(|hex| u8::from_str_radix(hex, 16).ok())
        {
            out.push(byte);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::{decode, encode};

    #[test]
    fn a_token_survives_the_cookie() {
        let token = "a;b=c,d%e\\f\"g~/";
        assert_eq!(decode(&encode(token)).as_deref(), Some(token));
        assert!(!encode(token).contains(';'));
    }
}
