//! Who may read the console and who may act on the store.
//!
//! - **Where it listens.** On a loopback address without tokens, the console
//!   is open to the host's own users, who could reach the store anyway. Any
//!   other address needs a token: [`Access::check_listen`] refuses to start
//!   without one.
//! - **Which names it answers to.** Without tokens, a request whose `Host`
//!   is not a loopback name (`localhost`, `127.0.0.1`, `[::1]`) or one the
//!   operator allowed ([`Console::allow_hosts`](crate::Console::allow_hosts),
//!   `--allow-host`) is refused with `421` before anything else runs: a web
//!   page that points a name of its own at `127.0.0.1` (DNS rebinding)
//!   reaches nothing. With tokens, `Host` is checked when names were added.
//! - **Tokens.** An operator token may read and act; a read-only token may
//!   read: its pages show no action buttons and its actions are refused
//!   (403). A client sends `Authorization: Bearer <token>`; a browser signs
//!   in once at `/login`, and gets a session: a random id in an `HttpOnly`,
//!   `SameSite=Strict` cookie (`Secure` over TLS), mapped in the console's
//!   memory to the token's role ([`crate::sessions`]). The token is never
//!   stored in the browser.
//! - **Guessing.** A wrong token, at `/login` or in a header, counts as a
//!   failure; past a few, further attempts must wait longer and longer and
//!   are answered `429` with `Retry-After` until then ([`crate::throttle`]).
//! - **Actions** are POSTs, and a POST must come from the console's own
//!   pages: a form (the sign-in form included) carries the value of the
//!   `idem_console_csrf` cookie in its `csrf` field (a page of another site
//!   can neither read that cookie nor set it), the API's POSTs take JSON
//!   only (which another site's page cannot send without the CORS consent
//!   this server never gives), and a request whose `Origin` names another
//!   host is refused. A request that carries its token in the
//!   `Authorization` header is not a browser's ambient credential and needs
//!   no CSRF token.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};
use idem_gateway::admin::AdminToken;

use crate::Shared;
use crate::problem::Problem;

/// The cookie a browser keeps its session id in after `/login`.
pub const SESSION_COOKIE: &str = "idem_console_session";
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

    pub(crate) fn role_of(&self, token: &str) -> Option<Role> {
        if self.operator.as_ref().is_some_and(|t| t.is(token)) {
            Some(Role::Operator)
        } else if self.viewer.as_ref().is_some_and(|t| t.is(token)) {
            Some(Role::Viewer)
        } else {
            None
        }
    }
}

/// How a caller showed who it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Credential {
    /// No tokens are set (loopback): nothing to show.
    None,
    /// `Authorization: Bearer`.
    Header,
    /// The session cookie `/login` set.
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

/// A `Set-Cookie` value for cookie `name`: `HttpOnly`, `SameSite=Strict`,
/// the whole console's path, `Secure` when the console is served over TLS,
/// and `Max-Age` when given (0 removes it).
pub(crate) fn set_cookie(
    shared: &Shared,
    name: &str,
    value: &str,
    max_age: Option<u64>,
) -> Option<HeaderValue> {
    let mut text = format!("{name}={value}; Path=/; HttpOnly; SameSite=Strict");
    if shared.secure_cookies {
        text.push_str("; Secure");
    }
    if let Some(seconds) = max_age {
        text.push_str(&format!("; Max-Age={seconds}"));
    }
    HeaderValue::from_str(&text).ok()
}

/// This browser's CSRF token: the `idem_console_csrf` cookie's value, or a
/// fresh one, with the `Set-Cookie` that gives it to the browser.
pub(crate) fn csrf_of(shared: &Shared, headers: &HeaderMap) -> (String, Option<HeaderValue>) {
    match cookie(headers, CSRF_COOKIE).filter(|v| !v.is_empty()) {
        Some(given) => (given.to_owned(), None),
        None => {
            let fresh = new_csrf();
            let header = set_cookie(shared, CSRF_COOKIE, &fresh, None);
            (fresh, header)
        }
    }
}

/// Whether a form's `csrf` field is the value of the browser's CSRF cookie,
/// compared in constant time.
pub(crate) fn csrf_matches(headers: &HeaderMap, sent: Option<&str>) -> bool {
    match (cookie(headers, CSRF_COOKIE).filter(|v| !v.is_empty()), sent) {
        (Some(cookie), Some(sent)) => {
            blake3::hash(cookie.as_bytes()) == blake3::hash(sent.as_bytes())
        }
        _ => false,
    }
}

/// Where a request came from, when the server knows.
pub(crate) fn peer_of(request: &Request) -> Option<IpAddr> {
    request
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|info| info.0.ip())
}

/// `429 Too Many Requests` with `Retry-After`: wrong tokens came too fast.
pub(crate) fn too_many(api: bool, wait: Duration) -> Response {
    let seconds = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
    let detail = format!(
        "refused: too many wrong tokens came from this address or from everyone lately; the token was not checked. Try again in {seconds} s"
    );
    let mut response = refuse(api, StatusCode::TOO_MANY_REQUESTS, &detail);
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(seconds.max(1)));
    response
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
pub(crate) fn same_origin(headers: &HeaderMap) -> bool {
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
pub(crate) const FORM_LIMIT: usize = 64 * 1024;

/// Middleware, outermost: refuses a request whose `Host` is not one the
/// console answers to, when it has no token or names were added.
pub(crate) async fn check_host(
    State(shared): State<Arc<Shared>>,
    request: Request,
    next: Next,
) -> Response {
    if (!shared.access.needs_token() || shared.hosts.is_extended())
        && let Some(refused) = shared.hosts.refusal(&request)
    {
        return refused;
    }
    next.run(request).await
}

/// The token of an `Authorization: Bearer` value.
fn bearer(value: &HeaderValue) -> Option<&str> {
    let (scheme, token) = value.to_str().ok()?.trim().split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

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
    let peer = peer_of(&request);
    let now = shared.clock.now();
    let headers = request.headers();
    let access = &shared.access;
    let found = if !access.needs_token() {
        Some((Role::Operator, Credential::None))
    } else if let Some(token) = headers.get(header::AUTHORIZATION).and_then(bearer) {
        if let Some(wait) = shared.throttle.wait(peer, now) {
            return too_many(api, wait);
        }
        let role = access.role_of(token);
        if role.is_none() {
            shared.throttle.failed(peer, now);
        }
        role.map(|role| (role, Credential::Header))
    } else {
        cookie(headers, SESSION_COOKIE)
            .and_then(|id| shared.sessions.find(id, now))
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
    let (csrf, set_csrf) = csrf_of(&shared, headers);
    let caller = Caller {
        role,
        credential,
        csrf,
        peer,
    };

    // Every action is a POST; other methods reach no handler that changes anything.
    if request.method() == Method::POST {
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
            } else if !csrf_matches(&parts.headers, form_field(&bytes, "csrf").as_deref()) {
                return refuse(
                    false,
                    StatusCode::FORBIDDEN,
                    "refused: the form did not carry this browser's CSRF token; open the page again and submit it from there",
                );
            }
            request = Request::from_parts(parts, Body::from(bytes));
        }
    }

    request.extensions_mut().insert(caller);
    let mut response = next.run(request).await;
    if let Some(value) = set_csrf {
        response.headers_mut().append(header::SET_COOKIE, value);
    }
    response
}

/// The first value of field `name` in a URL-encoded form.
pub(crate) fn form_field(body: &[u8], name: &str) -> Option<String> {
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

#[cfg(test)]
mod tests {
    use super::encode;

    #[test]
    fn a_path_survives_the_query() {
        let path = "/records/show?scope=a;b&key=c d%e\\f\"g~/";
        let query = format!("next={}", encode(path));
        let back: Vec<(String, String)> = serde_urlencoded::from_str(&query).unwrap();
        assert_eq!(back, [("next".to_owned(), path.to_owned())]);
        assert!(!encode(path).contains(['&', ';', '#', ' ']));
    }
}
