//! Connecting to a NATS server as its URL says (TLS, the credentials), and
//! a failure explained in words that say what to change.

use std::path::PathBuf;

use super::{Auth, NatsServer, NatsUrl};

/// Why a connection to NATS was not made.
#[derive(Debug)]
pub(crate) struct ConnectFailure {
    pub(crate) kind: Failure,
    pub(crate) message: String,
    pub(crate) source: Option<async_nats::ConnectError>,
}

/// What kind of failure: whether connecting again could help.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Failure {
    /// The credentials were refused.
    Refused,
    /// The URL, a file it names, or a certificate is wrong.
    Config,
    /// The server did not answer.
    Unavailable,
}

impl ConnectFailure {
    fn config(message: String) -> Self {
        Self {
            kind: Failure::Config,
            message,
            source: None,
        }
    }
}

/// Connects to the server `url` names (a source's or a destination's `url`),
/// with TLS and the credentials it gives, on top of `options`. A URL that
/// lists several servers hands the client all of them: it connects to one
/// that answers, and reconnects to another when that one drops.
pub(crate) async fn connect(
    url: &str,
    options: async_nats::ConnectOptions,
) -> Result<async_nats::Client, ConnectFailure> {
    let parsed = NatsUrl::parse(url).map_err(ConnectFailure::config)?;
    let server = NatsServer::parse(&parsed).map_err(ConnectFailure::config)?;
    let readable = |what: &str, path: &PathBuf| -> Result<(), ConnectFailure> {
        std::fs::metadata(path)
            .map(|_| ())
            .map_err(|e| ConnectFailure::config(format!("{what} file {}: {e}", path.display())))
    };
    let mut options = options.require_tls(server.tls);
    if let Some(ca) = &server.tls_ca {
        readable("tls_ca", ca)?;
        options = options.add_root_certificates(ca.clone());
    }
    if let Some((cert, key)) = &server.tls_cert {
        readable("tls_cert", cert)?;
        readable("tls_key", key)?;
        options = options.add_client_certificate(cert.clone(), key.clone());
    }
    options = match &server.auth {
        Auth::None => options,
        Auth::UserPassword(user, password) => {
            options.user_and_password(user.clone(), password.clone())
        }
        Auth::Token(token) => options.token(token.clone()),
        Auth::NKey(path) => {
            let seed = std::fs::read_to_string(path).map_err(|e| {
                ConnectFailure::config(format!("nkey seed file {}: {e}", path.display()))
            })?;
            let seed = seed
                .lines()
                .map(str::trim)
                .find(|line| line.starts_with('S'))
                .ok_or_else(|| {
                    ConnectFailure::config(format!(
                        "nkey seed file {} holds no seed (a line starting with S)",
                        path.display()
                    ))
                })?;
            options.nkey(seed.to_owned())
        }
        Auth::Creds(path) => {
            let creds = std::fs::read_to_string(path).map_err(|e| {
                ConnectFailure::config(format!("creds file {} cannot be read: {e}", path.display()))
            })?;
            options.credentials(&creds).map_err(|e| {
                ConnectFailure::config(format!(
                    "creds file {}: {e}; a .creds file holds a user JWT and an NKey seed, each between BEGIN and END lines",
                    path.display()
                ))
            })?
        }
    };
    options
        .connect(server.servers.as_slice())
        .await
        .map_err(|error| explain(&server, error))
}

fn explain(server: &NatsServer, error: async_nats::ConnectError) -> ConnectFailure {
    use async_nats::ConnectErrorKind as Kind;
    let chain = chain(&error);
    // A failed handshake may come as an I/O error: the certificate is named.
    let certificate = chain.contains("certificate");
    let tls = error.kind() == Kind::Tls || certificate;
    let (kind, message) = match error.kind() {
        Kind::AuthorizationViolation | Kind::Authentication => (
            Failure::Refused,
            format!(
                "authorization failed: the server refused the credentials ({chain}); fix them in the URL (nats://USER:PASSWORD@HOST, token=, nkey=FILE or creds=FILE) or the server's authorization"
            ),
        ),
        _ if tls && !server.tls => (
            Failure::Config,
            format!(
                "the server requires TLS and the handshake failed ({chain}); write tls://HOST:PORT or add ?tls=true, with tls_ca=FILE when the server's certificate is not signed by a CA the system trusts"
            ),
        ),
        _ if chain.contains("CertificateRequired") => (
            Failure::Config,
            format!(
                "the server requires a client certificate ({chain}): give tls_cert=FILE&tls_key=FILE"
            ),
        ),
        _ if certificate => (
            Failure::Config,
            format!(
                "the server's certificate did not verify ({chain}); give the CA that signed it with tls_ca=FILE, and connect by a name or address the certificate holds"
            ),
        ),
        _ if tls => (
            Failure::Config,
            format!(
                "TLS failed ({chain}); check tls_ca=, tls_cert= and tls_key=, and that the server speaks TLS"
            ),
        ),
        Kind::ServerParse => (
            Failure::Config,
            format!("{chain}; fix the server address (nats://HOST:PORT)"),
        ),
        _ => (Failure::Unavailable, chain),
    };
    ConnectFailure {
        kind,
        message,
        source: Some(error),
    }
}

/// An error and its sources, joined with `: `.
fn chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut next = error.source();
    while let Some(source) = next {
        let line = source.to_string();
        if !text.contains(&line) {
            text.push_str(": ");
            text.push_str(&line);
        }
        next = source.source();
    }
    text
}
