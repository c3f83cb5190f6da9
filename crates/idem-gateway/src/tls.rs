//! TLS for the gateway, on rustls with the *ring* provider: the client side
//! towards an `https://` upstream ([`UpstreamTls`]), and the listener's side
//! ([`ListenerTls`]) with a certificate that is reloaded without dropping a
//! connection, and optional client certificates (mTLS) whose subject can be
//! the principal that scopes keys.
//!
//! Every file is PEM. An error names the file and what was wrong with it.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use rustls::crypto::CryptoProvider;
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// The `--principal-header` value that scopes keys by the client
/// certificate's subject instead of a header.
pub const TLS_SUBJECT: &str = "tls-subject";

/// The header that carries the verified client certificate's subject (its
/// CN) when keys are scoped by it: set by the gateway from the TLS session
/// (a value the client sent is dropped), and forwarded to the upstream.
pub const TLS_SUBJECT_HEADER: &str = "x-idem-tls-subject";

/// A TLS file or setting that cannot be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsError {
    /// The file could not be read.
    #[error("cannot read {what} {path}: {source}")]
    Read {
        /// What the file was for.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not PEM of the kind expected, or holds none.
    #[error("{what} {path} is not usable: {reason}")]
    Pem {
        /// What the file was for.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// What was wrong.
        reason: String,
    },
    /// rustls refused the certificate, key or configuration.
    #[error("{context}: {source}")]
    Rustls {
        /// What was being set up.
        context: String,
        /// rustls's error.
        source: rustls::Error,
    },
    /// A certificate without its key, or the other way round.
    #[error("{0}")]
    Incomplete(String),
}

/// The crypto provider every TLS configuration here uses: *ring*.
pub(crate) fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Every certificate in the PEM file at `path` (at least one).
pub fn load_certs(
    what: &'static str,
    path: &Path,
) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let bytes = std::fs::read(path).map_err(|source| TlsError::Read {
        what,
        path: path.to_owned(),
        source,
    })?;
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Pem {
            what,
            path: path.to_owned(),
            reason: format!("invalid PEM: {e}"),
        })?;
    if certs.is_empty() {
        return Err(TlsError::Pem {
            what,
            path: path.to_owned(),
            reason: "no certificate in it (expected -----BEGIN CERTIFICATE-----)".to_owned(),
        });
    }
    Ok(certs)
}

/// The private key in the PEM file at `path` (PKCS#8, PKCS#1 or SEC1).
pub fn load_key(what: &'static str, path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let bytes = std::fs::read(path).map_err(|source| TlsError::Read {
        what,
        path: path.to_owned(),
        source,
    })?;
    PrivateKeyDer::from_pem_slice(&bytes).map_err(|e| TlsError::Pem {
        what,
        path: path.to_owned(),
        reason: match e {
            rustls_pki_types::pem::Error::NoItemsFound => {
                "no private key in it (expected -----BEGIN PRIVATE KEY-----)".to_owned()
            }
            other => format!("invalid PEM: {other}"),
        },
    })
}

/// The roots in the PEM file at `path`.
fn load_roots(what: &'static str, path: &Path) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for cert in load_certs(what, path)? {
        roots.add(cert).map_err(|source| TlsError::Rustls {
            context: format!(
                "{what} {} holds a certificate that is not a usable CA",
                path.display()
            ),
            source,
        })?;
    }
    Ok(roots)
}

/// A certificate chain and its key, checked to belong together.
fn certified_key(
    cert_what: &'static str,
    cert: &Path,
    key_what: &'static str,
    key: &Path,
) -> Result<CertifiedKey, TlsError> {
    let chain = load_certs(cert_what, cert)?;
    let private = load_key(key_what, key)?;
    let signing = provider()
        .key_provider
        .load_private_key(private)
        .map_err(|source| TlsError::Rustls {
            context: format!("{key_what} {} cannot sign", key.display()),
            source,
        })?;
    let certified = CertifiedKey::new(chain, signing);
    certified.keys_match().map_err(|source| TlsError::Rustls {
        context: format!(
            "{key_what} {} does not belong to {cert_what} {}",
            key.display(),
            cert.display()
        ),
        source,
    })?;
    Ok(certified)
}

/// How the gateway talks TLS to an `https://` upstream: the roots it trusts
/// (webpki's bundled Mozilla roots, or a CA file) and an optional client
/// certificate. The server name sent (SNI) and checked is the upstream's host.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UpstreamTls {
    /// A PEM file of the CA certificates to trust instead of the bundled roots.
    pub ca: Option<PathBuf>,
    /// A PEM client certificate (chain) to present.
    pub cert: Option<PathBuf>,
    /// Its PEM private key.
    pub key: Option<PathBuf>,
}

impl UpstreamTls {
    /// The rustls client configuration (no ALPN set: the connector sets it).
    pub fn client_config(&self) -> Result<ClientConfig, TlsError> {
        let builder = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|source| TlsError::Rustls {
                context: "cannot set up TLS towards the upstream".to_owned(),
                source,
            })?;
        let builder = match &self.ca {
            Some(ca) => builder.with_root_certificates(load_roots("the upstream CA file", ca)?),
            None => hyper_rustls::ConfigBuilderExt::with_webpki_roots(builder),
        };
        let config = match (&self.cert, &self.key) {
            (None, None) => builder.with_no_client_auth(),
            (Some(cert), Some(key)) => {
                let chain = load_certs("the upstream client certificate", cert)?;
                let private = load_key("the upstream client key", key)?;
                builder
                    .with_client_auth_cert(chain, private)
                    .map_err(|source| TlsError::Rustls {
                        context: format!(
                            "the upstream client certificate {} and key {} cannot be used together",
                            cert.display(),
                            key.display()
                        ),
                        source,
                    })?
            }
            (Some(_), None) => {
                return Err(TlsError::Incomplete(
                    "--upstream-cert was given without --upstream-key: give both, or neither"
                        .to_owned(),
                ));
            }
            (None, Some(_)) => {
                return Err(TlsError::Incomplete(
                    "--upstream-key was given without --upstream-cert: give both, or neither"
                        .to_owned(),
                ));
            }
        };
        Ok(config)
    }

    /// Whether anything differs from the defaults.
    pub fn is_default(&self) -> bool {
        self == &Self::default()
    }
}

/// The listener's TLS files: its certificate and key, and optionally the CA
/// that client certificates must be signed by (mTLS).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenerTls {
    /// The PEM certificate chain served.
    pub cert: PathBuf,
    /// Its PEM private key.
    pub key: PathBuf,
    /// When set, every client must present a certificate signed by a CA in
    /// this PEM file.
    pub client_ca: Option<PathBuf>,
}

impl ListenerTls {
    /// Loads the files: the server configuration, and the handle that
    /// reloads the certificate.
    pub fn load(&self) -> Result<(Arc<ServerConfig>, CertReloader), TlsError> {
        let resolver = Arc::new(ReloadingCert {
            cert: self.cert.clone(),
            key: self.key.clone(),
            current: RwLock::new(Arc::new(certified_key(
                "the TLS certificate",
                &self.cert,
                "the TLS key",
                &self.key,
            )?)),
        });
        let builder = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|source| TlsError::Rustls {
                context: "cannot set up the TLS listener".to_owned(),
                source,
            })?;
        let builder = match &self.client_ca {
            None => builder.with_no_client_auth(),
            Some(ca) => {
                let roots = load_roots("the client CA file", ca)?;
                let verifier =
                    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
                        .build()
                        .map_err(|e| TlsError::Pem {
                            what: "the client CA file",
                            path: ca.clone(),
                            reason: e.to_string(),
                        })?;
                builder.with_client_cert_verifier(verifier)
            }
        };
        let mut config =
            builder.with_cert_resolver(Arc::clone(&resolver) as Arc<dyn ResolvesServerCert>);
        // HTTP/2 offered first, for gRPC clients (they require it over TLS).
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok((Arc::new(config), CertReloader { resolver }))
    }
}

/// The served certificate, replaced on reload: new handshakes get the new
/// one, connections already open keep theirs.
#[derive(Debug)]
struct ReloadingCert {
    cert: PathBuf,
    key: PathBuf,
    current: RwLock<Arc<CertifiedKey>>,
}

impl ResolvesServerCert for ReloadingCert {
    fn resolve(&self, _client_hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(Arc::clone(
            &self
                .current
                .read()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        ))
    }
}

/// Reloads the listener's certificate and key from their files. Cheap to
/// clone.
#[derive(Debug, Clone)]
pub struct CertReloader {
    resolver: Arc<ReloadingCert>,
}

impl CertReloader {
    /// Reads the certificate and key files again and serves them to new
    /// connections. When they cannot be used the old ones stay, and the
    /// error says why.
    pub fn reload(&self) -> Result<(), TlsError> {
        let fresh = certified_key(
            "the TLS certificate",
            &self.resolver.cert,
            "the TLS key",
            &self.resolver.key,
        )?;
        *self
            .resolver
            .current
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(fresh);
        Ok(())
    }

    /// [`reload`](Self::reload), logged: `info` when the new certificate is
    /// served, `error` (the old one kept) when it cannot be used.
    pub fn reload_logged(&self, why: &str) {
        match self.reload() {
            Ok(()) => tracing::info!(
                cert = %self.resolver.cert.display(),
                "{why}: reloaded the TLS certificate; new connections get it"
            ),
            Err(error) => tracing::error!(
                %error,
                "{why}: the new TLS certificate cannot be used; still serving the old one"
            ),
        }
    }

    /// Reloads whenever the certificate or key file changes (checked every
    /// `every`), until the task is aborted.
    pub fn watch(&self, every: Duration) -> tokio::task::JoinHandle<()> {
        let reloader = self.clone();
        // What the files hold now, before the task first runs: a change made
        // right after this call is seen.
        let mut seen = reloader.contents();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                let now = reloader.contents();
                if now != seen {
                    seen = now;
                    reloader.reload_logged("the TLS certificate or key file changed");
                }
            }
        })
    }

    /// A hash of what the certificate and key files hold (`None` for one
    /// that cannot be read): a change of content, whatever the timestamps
    /// say.
    fn contents(&self) -> [Option<blake3::Hash>; 2] {
        [&self.resolver.cert, &self.resolver.key]
            .map(|path| std::fs::read(path).ok().map(|bytes| blake3::hash(&bytes)))
    }
}

/// The subject a verified client certificate names: its common name (CN)
/// when it is printable ASCII, else the whole subject in hex (so two
/// different subjects never share a principal, and the value always fits in
/// a header); `None` when the DER cannot be read.
pub(crate) fn subject_of(cert: &CertificateDer<'_>) -> Option<String> {
    let subject = der::subject(cert.as_ref())?;
    Some(match der::common_name(subject) {
        Some(cn)
            if !cn.is_empty()
                && !cn.starts_with('#')
                && cn.bytes().all(|b| b.is_ascii_graphic() || b == b' ') =>
        {
            cn
        }
        _ => {
            let hex: String = subject.iter().map(|b| format!("{b:02x}")).collect();
            format!("#{hex}")
        }
    })
}

/// Just enough DER to find a certificate's subject and its CN.
mod der {
    /// One TLV: its tag, its contents, and what follows it.
    fn next(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
        let (&tag, rest) = input.split_first()?;
        let (&first, mut rest) = rest.split_first()?;
        let len = if first < 0x80 {
            usize::from(first)
        } else {
            let count = usize::from(first & 0x7f);
            if count == 0 || count > 4 || rest.len() < count {
                return None;
            }
            let (bytes, after) = rest.split_at(count);
            rest = after;
            bytes.iter().fold(0usize, |n, &b| (n << 8) | usize::from(b))
        };
        if rest.len() < len {
            return None;
        }
        let (contents, after) = rest.split_at(len);
        Some((tag, contents, after))
    }

    /// The subject Name (its contents) of a DER certificate.
    pub(super) fn subject(cert: &[u8]) -> Option<&[u8]> {
        let (0x30, certificate, _) = next(cert)? else {
            return None;
        };
        let (0x30, tbs, _) = next(certificate)? else {
            return None;
        };
        let mut rest = tbs;
        // [0] version is optional.
        if rest.first() == Some(&0xa0) {
            rest = next(rest)?.2;
        }
        // serialNumber, signature, issuer, validity, then subject.
        for _ in 0..4 {
            rest = next(rest)?.2;
        }
        let (0x30, subject, _) = next(rest)? else {
            return None;
        };
        Some(subject)
    }

    /// The first commonName (2.5.4.3) in a Name's contents.
    pub(super) fn common_name(mut name: &[u8]) -> Option<String> {
        const CN: &[u8] = &[0x55, 0x04, 0x03];
        while !name.is_empty() {
            let (_, set, after) = next(name)?;
            name = after;
            let mut attributes = set;
            while !attributes.is_empty() {
                let (_, attribute, after) = next(attributes)?;
                attributes = after;
                let (0x06, oid, value) = next(attribute)? else {
                    continue;
                };
                if oid == CN {
                    let (_, text, _) = next(value)?;
                    return String::from_utf8(text.to_vec()).ok();
                }
            }
        }
        None
    }
}
