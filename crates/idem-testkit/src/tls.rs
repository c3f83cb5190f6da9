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
        let ca = ca("Idem test CA");
        let other = ca_only("Idem other CA");
        let server = leaf(
            &ca,
            "localhost",
            vec!["localhost".into(), "127.0.0.1".into()],
            ExtendedKeyUsagePurpose::ServerAuth,
        );
        let client = leaf(
            &ca,
            "idem-client",
            vec!["idem-client".into()],
            ExtendedKeyUsagePurpose::ClientAuth,
        );
        let write = |name: &str, text: &str| -> PathBuf {
            let path = dir.path().join(name);
            std::fs::write(&path, text).expect("write a certificate file");
            path
        };
        Self {
            ca: write("ca.pem", &ca.pem()),
            server_cert: write("server.pem", &server.0),
            server_key: write("server-key.pem", &server.1),
            client_cert: write("client.pem", &client.0),
            client_key: write("client-key.pem", &client.1),
            other_ca: write("other-ca.pem", &other),
            dir,
        }
    }

    /// The directory the files are in.
    pub fn dir(&self) -> &Path {
        self.dir.path()
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

fn ca(name: &str) -> CertifiedIssuer<'static, KeyPair> {
    let key = KeyPair::generate().expect("a CA key");
    CertifiedIssuer::self_signed(ca_params(name), key).expect("a self-signed CA")
}

fn ca_only(name: &str) -> String {
    ca(name).pem()
}

/// A certificate and its key, PEM.
fn leaf(
    ca: &CertifiedIssuer<'static, KeyPair>,
    name: &str,
    names: Vec<String>,
    usage: ExtendedKeyUsagePurpose,
) -> (String, String) {
    let mut params = CertificateParams::new(names).expect("certificate parameters");
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![usage];
    let key = KeyPair::generate().expect("a key");
    let cert = params.signed_by(&key, ca).expect("a signed certificate");
    (cert.pem(), key.serialize_pem())
}
