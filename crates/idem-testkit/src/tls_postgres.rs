//! A throwaway PostgreSQL server that accepts only TLS connections with a
//! password, for tests of how clients connect securely.
//!
//! [`TlsPostgres::start`] makes a certificate authority and a server
//! certificate for `localhost` (only: not for `127.0.0.1`, so that a test
//! can tell `verify-full` from `verify-ca`) signed by it (with `rcgen`),
//! runs `initdb` into a temporary directory with a password for `postgres` and
//! SCRAM authentication, allows only `hostssl` connections from 127.0.0.1
//! (`hostnossl` is rejected), and starts the server on a free loopback port.
//! The server is stopped and its directory removed when the value is dropped.
//!
//! PostgreSQL refuses to run as root: a test run as root runs the server as
//! the `postgres` system user, in a directory that user owns.
//!
//! The server programs are looked for under `/usr/lib/postgresql/VERSION/bin`
//! (the newest version), or in `IDEM_TEST_POSTGRES_BIN` if set. When they are
//! missing or the server cannot start, [`TlsPostgres::start`] skips the test
//! with a message, or fails it when `IDEM_REQUIRE_SERVICES` is set.

use std::fmt;
use std::path::{Path, PathBuf};

pub use crate::server_process::StartError;
use crate::server_process::{
    NotAccepting, SERVER_USER, append_file, check, command_as, fail, free_port, postgres_binaries,
    server_dir, wait_until_accepting, write_file,
};
use crate::tls::TlsPems;

/// The variable naming a directory with `initdb`, `pg_ctl` and `postgres`.
pub const BIN_VARIABLE: &str = "IDEM_TEST_POSTGRES_BIN";

/// A running server that requires TLS and a password; stopped and removed
/// when dropped.
pub struct TlsPostgres {
    bin: PathBuf,
    // Removed (with the data) when the server is dropped.
    dir: tempfile::TempDir,
    run_as: Option<String>,
    port: u16,
    password: String,
    ca_file: PathBuf,
    other_ca_file: PathBuf,
}

impl fmt::Debug for TlsPostgres {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Without the password.
        f.debug_struct("TlsPostgres")
            .field("dir", &self.dir.path())
            .field("port", &self.port)
            .field("ca_file", &self.ca_file)
            .finish_non_exhaustive()
    }
}

impl TlsPostgres {
    /// Starts a server whose user `postgres` has `password`; `None` (after
    /// saying so) when it cannot start and services are not required, a
    /// panic when they are.
    pub fn start(password: &str) -> Option<TlsPostgres> {
        match Self::try_start(password) {
            Ok(server) => Some(server),
            Err(error) => {
                crate::services::missing_service("a private PostgreSQL with TLS", &error.0);
                None
            }
        }
    }

    /// Starts a server whose user `postgres` has `password`.
    pub fn try_start(password: &str) -> Result<TlsPostgres, StartError> {
        let bin = postgres_binaries(BIN_VARIABLE, Path::new(crate::postgres::INSTALLED_SERVERS))?;
        let (dir, owner) = server_dir("idem-tls-pg-", "PostgreSQL")?;
        let port = free_port()?;

        // The server certificate names `localhost` only, so that `verify-full`
        // against 127.0.0.1 fails where `verify-ca` passes.
        let pki = TlsPems::generate(&["localhost"]);
        let ca_file = dir.path().join("ca.crt");
        let other_ca_file = dir.path().join("other-ca.crt");
        let cert_file = dir.path().join("server.crt");
        let key_file = dir.path().join("server.key");
        let pwfile = dir.path().join("pwfile");
        for (path, text, mode) in [
            (&ca_file, pki.ca.as_str(), 0o644),
            (&other_ca_file, pki.other_ca.as_str(), 0o644),
            (&cert_file, pki.server_cert.as_str(), 0o644),
            (&key_file, pki.server_key.as_str(), 0o600),
            (&pwfile, password, 0o600),
        ] {
            write_file(path, text, mode, owner)?;
        }

        let server = TlsPostgres {
            bin,
            dir,
            run_as: owner.map(|_| SERVER_USER.to_owned()),
            port,
            password: password.to_owned(),
            ca_file,
            other_ca_file,
        };
        let data = server.data();
        server.run(
            "initdb",
            &[
                "-D",
                &data.display().to_string(),
                "-U",
                "postgres",
                &format!("--pwfile={}", pwfile.display()),
                "--auth=scram-sha-256",
                "--no-sync",
                "--encoding=UTF8",
            ],
        )?;
        std::fs::remove_file(&pwfile).ok();

        let config = format!(
            "\n# idem-testkit: TLS only, loopback only\n\
             listen_addresses = '127.0.0.1'\n\
             port = {port}\n\
             unix_socket_directories = '{dir}'\n\
             ssl = on\n\
             ssl_cert_file = '{cert}'\n\
             ssl_key_file = '{key}'\n\
             password_encryption = 'scram-sha-256'\n\
             fsync = off\n",
            dir = server.dir.path().display(),
            cert = cert_file.display(),
            key = key_file.display(),
        );
        append_file(&data.join("postgresql.conf"), &config)?;
        let hba = "# idem-testkit: TLS and a password, from 127.0.0.1 only\n\
                   hostnossl all all 0.0.0.0/0 reject\n\
                   hostssl all all 127.0.0.1/32 scram-sha-256\n";
        write_file(&data.join("pg_hba.conf"), hba, 0o600, owner)?;

        let log = server.log().display().to_string();
        server.run(
            "pg_ctl",
            &[
                "-D",
                &data.display().to_string(),
                "-l",
                &log,
                "-w",
                "-t",
                "60",
                "start",
            ],
        )?;
        server.wait_until_it_accepts()?;
        Ok(server)
    }

    /// The loopback port the server listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The password of user `postgres`.
    pub fn password(&self) -> &str {
        &self.password
    }

    /// The PEM file of the authority that signed the server's certificate.
    pub fn ca_file(&self) -> &Path {
        &self.ca_file
    }

    /// The PEM file of another authority, which did not sign it.
    pub fn other_ca_file(&self) -> &Path {
        &self.other_ca_file
    }

    /// `postgres://postgres:PASSWORD@HOST:PORT/postgres?QUERY` (no `?` when
    /// `query` is empty); `password` is put in the URL percent-encoded.
    pub fn url(&self, host: &str, password: &str, query: &str) -> String {
        let password: String = password
            .bytes()
            .map(|b| match b {
                b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                    char::from(b).to_string()
                }
                _ => format!("%{b:02X}"),
            })
            .collect();
        let query = if query.is_empty() {
            String::new()
        } else {
            format!("?{query}")
        };
        format!(
            "postgres://postgres:{password}@{host}:{}/postgres{query}",
            self.port
        )
    }

    /// The URL with the right password and `sslmode=verify-full` against
    /// [`ca_file`](Self::ca_file).
    pub fn verified_url(&self) -> String {
        self.url(
            "localhost",
            &self.password,
            &format!("sslmode=verify-full&sslrootcert={}", self.ca_file.display()),
        )
    }

    /// The server's log so far, to explain a failure.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(self.log()).unwrap_or_default()
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn log(&self) -> PathBuf {
        self.dir.path().join("server.log")
    }

    fn wait_until_it_accepts(&self) -> Result<(), StartError> {
        wait_until_accepting(self.port, || None).map_err(|_: NotAccepting| {
            fail(format!(
                "PostgreSQL did not accept connections on port {} within 30 s; its log:\n{}",
                self.port,
                self.log_text()
            ))
        })
    }

    fn run(&self, program: &str, args: &[&str]) -> Result<(), StartError> {
        let path = self.bin.join(program);
        let mut command = command_as(&path, self.run_as.as_deref(), self.dir.path());
        check(&format!("{}", path.display()), command.args(args).output()).map_err(|e| {
            let log = self.log_text();
            if log.is_empty() {
                e
            } else {
                fail(format!("{e}; the server's log:\n{log}"))
            }
        })
    }
}

impl Drop for TlsPostgres {
    fn drop(&mut self) {
        let data = self.data().display().to_string();
        let stopped = self.run("pg_ctl", &["-D", &data, "stop", "-m", "immediate", "-w"]);
        if let Err(error) = stopped {
            eprintln!(
                "warning: the private PostgreSQL in {} may still be running: {error}",
                self.dir.path().display()
            );
        }
    }
}
