//! Certificates for tests of TLS connections, made on the spot with rcgen
//! (ring): a CA, a server certificate for `localhost` and `127.0.0.1` signed
//! by it, a client certificate signed by it, and a second CA that signed
//! nothing (to show a server whose certificate does not verify), all written
//! as PEM files to a temporary directory that lives as long as the value.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use rustls_pki_types::CertificateDer;

/// PEM files of a test PKI, in a directory removed on drop.
#[derive(Debug)]
pub struct TlsFiles {
    dir: tempfile::TempDir,
    /// The CA that signed the server's and the client's certificates.
    pub ca: PathBuf,
    /// The server's certificate (for `localhost` and `127.0.0.1`).
    pub server_cert: PathBuf,
    /// The server's private key (PKCS#8).
    pub server_key: PathBuf,
    /// The client's certificate (common name `idem-client`).
    pub client_cert: PathBuf,
    /// The client's private key (PKCS#8).
    pub client_key: PathBuf,
    /// A CA that signed none of these: a client trusting only it must
    /// refuse the server.
    pub other_ca: PathBuf,
}

impl TlsFiles {
    /// Makes the certificates and writes them.
    pub fn generate() -> Self {
        let dir = tempfile::tempdir().expect("a temporary directory for certificates");
        let pems = TlsPems::generate(&["localhost", "127.0.0.1"]);
        let write = |name: &str, text: &str| -> PathBuf {
            let path = dir.path().join(name);
            std::fs::write(&path, text).expect("write a certificate file");
            path
        };
        Self {
            ca: write("ca.pem", &pems.ca),
            server_cert: write("server.pem", &pems.server_cert),
            server_key: write("server-key.pem", &pems.server_key),
            client_cert: write("client.pem", &pems.client_cert),
            client_key: write("client-key.pem", &pems.client_key),
            other_ca: write("other-ca.pem", &pems.other_ca),
            dir,
        }
    }

    /// The directory the files are in.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

/// The same test PKI as PEM text, for a server that writes its files itself
/// (with its own owner and modes).
#[derive(Debug)]
pub struct TlsPems {
    /// The CA that signed the server's and the client's certificates.
    pub ca: String,
    /// The server's certificate, for the names it was made for.
    pub server_cert: String,
    /// The server's private key (PKCS#8).
    pub server_key: String,
    /// The client's certificate (common name `idem-client`).
    pub client_cert: String,
    /// The client's private key (PKCS#8).
    pub client_key: String,
    /// A CA that signed none of these.
    pub other_ca: String,
}

impl TlsPems {
    /// Makes the certificates, the server's for `server_names` (its common
    /// name is the first).
    pub fn generate(server_names: &[&str]) -> Self {
        let ca = TestCa::new("Idem test CA");
        let server = ca.server_for(
            server_names.first().copied().unwrap_or("localhost"),
            server_names,
        );
        let client = ca.client("idem-client");
        Self {
            ca: ca.pem(),
            server_cert: server.cert_pem,
            server_key: server.key_pem,
            client_cert: client.cert_pem,
            client_key: client.key_pem,
            other_ca: TestCa::new("Idem other CA").pem(),
        }
    }
}

/// A throwaway certificate authority that signs server and client
/// certificates on request.
pub struct TestCa {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

impl std::fmt::Debug for TestCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestCa").finish_non_exhaustive()
    }
}

/// A certificate a [`TestCa`] signed, and its key, as PEM and DER.
#[derive(Debug, Clone)]
pub struct Issued {
    /// The certificate, PEM.
    pub cert_pem: String,
    /// The private key (PKCS#8), PEM.
    pub key_pem: String,
    /// The certificate, DER.
    pub der: CertificateDer<'static>,
    /// The private key (PKCS#8), DER.
    pub key_der: Vec<u8>,
}

impl TestCa {
    /// A new authority whose subject's common name is `name`.
    pub fn new(name: &str) -> Self {
        let key = KeyPair::generate().expect("a CA key");
        let issuer = CertifiedIssuer::self_signed(ca_params(name), key).expect("a self-signed CA");
        Self { issuer }
    }

    /// The authority's certificate, PEM.
    pub fn pem(&self) -> String {
        self.issuer.pem()
    }

    /// The authority's certificate, DER.
    pub fn der(&self) -> CertificateDer<'static> {
        self.issuer.der().clone()
    }

    /// A server certificate for `127.0.0.1` and `localhost`, common name `cn`.
    pub fn server(&self, cn: &str) -> Issued {
        self.server_for(cn, &["127.0.0.1", "localhost"])
    }

    /// A server certificate for `names` only, common name `cn`.
    pub fn server_for(&self, cn: &str, names: &[&str]) -> Issued {
        self.issue(
            cn,
            names.iter().map(|name| (*name).to_owned()).collect(),
            ExtendedKeyUsagePurpose::ServerAuth,
        )
    }

    /// A client certificate whose subject's common name is `cn`.
    pub fn client(&self, cn: &str) -> Issued {
        self.issue(cn, Vec::new(), ExtendedKeyUsagePurpose::ClientAuth)
    }

    fn issue(&self, cn: &str, names: Vec<String>, usage: ExtendedKeyUsagePurpose) -> Issued {
        let mut params = CertificateParams::new(names).expect("certificate parameters");
        params.distinguished_name.push(DnType::CommonName, cn);
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![usage];
        let key = KeyPair::generate().expect("a key");
        let cert = params
            .signed_by(&key, &self.issuer)
            .expect("a signed certificate");
        Issued {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            der: cert.der().clone(),
            key_der: key.serialize_der(),
        }
    }
}

fn ca_params(name: &str) -> CertificateParams {
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA parameters");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params
}
