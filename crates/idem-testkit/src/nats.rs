//! A `nats-server` of the test's own, with JetStream, on a free port and
//! with the configuration the test gives (TLS, authorization), stopped and
//! its files removed on drop.
//!
//! The binary is `$IDEM_NATS_SERVER`, else `nats-server` on the `PATH`, else
//! `/usr/sbin/nats-server`.
//!
//! [`NatsServer::start_operator_mode`] starts one in operator mode (NATS's
//! decentralized authentication): users prove who they are with a user JWT
//! signed by an account, whose JWT the operator signed, and the NKey seed of
//! the user (a `.creds` file holds both). [`Operator`], [`Account`] and
//! [`User`] make those keys and JWTs on the spot.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running `nats-server`.
#[derive(Debug)]
pub struct NatsServer {
    child: Child,
    port: u16,
    dir: tempfile::TempDir,
}

impl NatsServer {
    /// Starts a server with JetStream whose configuration file also holds
    /// `config` (e.g. a `tls { ... }` and an `authorization { ... }` block);
    /// `None` (after [`missing_service`](crate::services::missing_service))
    /// when no `nats-server` binary is found.
    pub async fn start(config: &str) -> Option<Self> {
        let Some(binary) = binary() else {
            crate::services::missing_service(
                "nats-server",
                "no nats-server binary (set IDEM_NATS_SERVER, or put it on the PATH)",
            );
            return None;
        };
        let dir = tempfile::tempdir().expect("a directory for nats-server");
        let port = free_port();
        let mut text = String::new();
        let store = dir.path().join("jetstream");
        writeln!(text, "listen: \"127.0.0.1:{port}\"").unwrap();
        writeln!(
            text,
            "jetstream {{ store_dir: {:?} }}",
            store.display().to_string()
        )
        .unwrap();
        text.push_str(config);
        let file = dir.path().join("nats.conf");
        std::fs::write(&file, text).expect("write the nats-server configuration");
        let log = std::fs::File::create(dir.path().join("nats.log")).expect("the server's log");
        let child = Command::new(binary)
            .arg("-c")
            .arg(&file)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("the log, twice"))
            .stderr(log)
            .spawn()
            .expect("start nats-server");
        let mut server = Self { child, port, dir };
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_ok()
            {
                return Some(server);
            }
            if let Ok(Some(status)) = server.child.try_wait() {
                panic!("nats-server exited ({status}):\n{}", server.log());
            }
            assert!(
                Instant::now() < deadline,
                "nats-server did not listen within 15 s:\n{}",
                server.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Starts a server in operator mode: it trusts `operator`, knows
    /// `accounts` (JWTs signed by it, preloaded into a memory resolver), and
    /// its configuration also holds `config`. A user connects with a
    /// [`User::creds`] file of one of those accounts.
    pub async fn start_operator_mode(
        operator: &Operator,
        accounts: &[&Account],
        config: &str,
    ) -> Option<Self> {
        let mut text = String::new();
        writeln!(text, "operator: {:?}", operator.jwt()).unwrap();
        writeln!(text, "system_account: {}", operator.system.public_key()).unwrap();
        writeln!(text, "resolver: MEMORY").unwrap();
        writeln!(text, "resolver_preload: {{").unwrap();
        for account in std::iter::once(&&operator.system).chain(accounts) {
            writeln!(text, "  {}: {:?}", account.public_key(), account.jwt()).unwrap();
        }
        writeln!(text, "}}").unwrap();
        text.push_str(config);
        Self::start(&text).await
    }

    /// The port it listens on, at 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// What the server wrote so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("nats.log")).unwrap_or_default()
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The `nats-server` binary: `$IDEM_NATS_SERVER`, else on the `PATH`,
/// else `/usr/sbin/nats-server`.
pub(crate) fn binary() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("IDEM_NATS_SERVER") {
        return Some(path.into());
    }
    let on_path = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join("nats-server"))
            .find(|candidate| candidate.is_file())
    });
    on_path.or_else(|| {
        let sbin = PathBuf::from("/usr/sbin/nats-server");
        sbin.is_file().then_some(sbin)
    })
}

/// A port nothing listens on now (the OS's choice for an ephemeral bind).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|address| address.port())
        .expect("a free port")
}

/// An operator: the root of trust of a server in operator mode, a key pair
/// and its self-signed JWT, with the system account the server needs (for
/// JetStream's internal subscriptions).
pub struct Operator {
    key: nkeys::KeyPair,
    jwt: String,
    system: Account,
}

/// An account an [`Operator`] signed, with JetStream enabled and no limits.
pub struct Account {
    key: nkeys::KeyPair,
    jwt: String,
}

/// A user an [`Account`] signed, allowed to publish and subscribe to every
/// subject.
pub struct User {
    key: nkeys::KeyPair,
    jwt: String,
}

macro_rules! debug_by_public_key {
    ($($kind:ident),*) => {$(
        impl std::fmt::Debug for $kind {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.debug_struct(stringify!($kind))
                    .field("public_key", &self.key.public_key())
                    .finish_non_exhaustive()
            }
        }
    )*};
}
debug_by_public_key!(Operator, Account, User);

impl Operator {
    /// A new operator named `name`.
    pub fn new(name: &str) -> Self {
        let key = nkeys::KeyPair::new_operator();
        let system = nkeys::KeyPair::new_account();
        let jwt = jwt::encode(
            &key,
            &key.public_key(),
            name,
            serde_json::json!({
                "system_account": system.public_key(),
                "type": "operator",
                "version": 2,
            }),
        );
        let system = Account::signed(&key, system, "SYS", false);
        Self { key, jwt, system }
    }

    /// Its public key (`O...`).
    pub fn public_key(&self) -> String {
        self.key.public_key()
    }

    /// Its JWT.
    pub fn jwt(&self) -> &str {
        &self.jwt
    }

    /// A new account named `name`, signed by this operator.
    pub fn account(&self, name: &str) -> Account {
        Account::signed(&self.key, nkeys::KeyPair::new_account(), name, true)
    }
}

impl Account {
    /// The account of `key`, signed by `operator`, with or without JetStream.
    fn signed(operator: &nkeys::KeyPair, key: nkeys::KeyPair, name: &str, jetstream: bool) -> Self {
        let mut limits = serde_json::json!({
            "subs": -1, "data": -1, "payload": -1,
            "imports": -1, "exports": -1, "wildcards": true,
            "conn": -1, "leaf": -1,
        });
        if jetstream {
            for limit in ["mem_storage", "disk_storage", "streams", "consumer"] {
                limits[limit] = serde_json::json!(-1);
            }
        }
        let jwt = jwt::encode(
            operator,
            &key.public_key(),
            name,
            serde_json::json!({
                "limits": limits,
                "default_permissions": { "pub": {}, "sub": {} },
                "type": "account",
                "version": 2,
            }),
        );
        Self { key, jwt }
    }

    /// Its public key (`A...`).
    pub fn public_key(&self) -> String {
        self.key.public_key()
    }

    /// Its JWT.
    pub fn jwt(&self) -> &str {
        &self.jwt
    }

    /// A new user named `name`, signed by this account.
    pub fn user(&self, name: &str) -> User {
        let key = nkeys::KeyPair::new_user();
        let jwt = jwt::encode(
            &self.key,
            &key.public_key(),
            name,
            serde_json::json!({
                "pub": {}, "sub": {},
                "subs": -1, "data": -1, "payload": -1,
                "type": "user",
                "version": 2,
            }),
        );
        User { key, jwt }
    }
}

impl User {
    /// Its public key (`U...`).
    pub fn public_key(&self) -> String {
        self.key.public_key()
    }

    /// Its JWT.
    pub fn jwt(&self) -> &str {
        &self.jwt
    }

    /// Its NKey seed (`SU...`).
    pub fn seed(&self) -> String {
        self.key.seed().expect("a user key pair has a seed")
    }

    /// The text of its `.creds` file: the user JWT and the NKey seed, in
    /// the decorated form `nsc` writes.
    pub fn creds(&self) -> String {
        format!(
            "-----BEGIN NATS USER JWT-----\n{}\n------END NATS USER JWT------\n\n\
             ************************* IMPORTANT *************************\n\
             NKEY Seed printed below can be used to sign and prove identity.\n\
             NKEYs are sensitive and should be treated as secrets.\n\n\
             -----BEGIN USER NKEY SEED-----\n{}\n------END USER NKEY SEED------\n\n\
             *************************************************************\n",
            self.jwt,
            self.seed()
        )
    }
}

/// NATS JWTs (version 2): `base64url(header).base64url(claims).base64url(signature)`,
/// the signature the issuer's ed25519 NKey made over the first two parts.
mod jwt {
    use data_encoding::{BASE32_NOPAD, BASE64URL_NOPAD};
    use sha2::{Digest, Sha256};

    /// A JWT issued by `issuer` for `subject`, with these `nats` claims.
    pub(super) fn encode(
        issuer: &nkeys::KeyPair,
        subject: &str,
        name: &str,
        nats: serde_json::Value,
    ) -> String {
        let issued_at = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("a clock after 1970")
            .as_secs();
        let mut claims = serde_json::json!({
            "jti": "",
            "iat": issued_at,
            "iss": issuer.public_key(),
            "name": name,
            "sub": subject,
            "nats": nats,
        });
        // The JWT's id: a hash of the claims without it.
        let id = BASE32_NOPAD.encode(&Sha256::digest(claims.to_string().as_bytes()));
        claims["jti"] = serde_json::Value::String(id);
        let header = BASE64URL_NOPAD.encode(br#"{"typ":"JWT","alg":"ed25519-nkey"}"#);
        let body = BASE64URL_NOPAD.encode(claims.to_string().as_bytes());
        let signed = format!("{header}.{body}");
        let signature = issuer
            .sign(signed.as_bytes())
            .expect("an NKey with a seed signs");
        format!("{signed}.{}", BASE64URL_NOPAD.encode(&signature))
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn the_signature_verifies_with_the_issuers_public_key() {
            let issuer = nkeys::KeyPair::new_account();
            let user = nkeys::KeyPair::new_user();
            let jwt = encode(&issuer, &user.public_key(), "u", serde_json::json!({}));
            let parts: Vec<&str> = jwt.split('.').collect();
            assert_eq!(parts.len(), 3);
            let claims: serde_json::Value =
                serde_json::from_slice(&BASE64URL_NOPAD.decode(parts[1].as_bytes()).unwrap())
                    .unwrap();
            assert_eq!(claims["iss"], issuer.public_key());
            assert_eq!(claims["sub"], user.public_key());
            let signature = BASE64URL_NOPAD.decode(parts[2].as_bytes()).unwrap();
            let public = nkeys::KeyPair::from_public_key(&issuer.public_key()).unwrap();
            public
                .verify(format!("{}.{}", parts[0], parts[1]).as_bytes(), &signature)
                .expect("the signature verifies");
        }
    }
}
