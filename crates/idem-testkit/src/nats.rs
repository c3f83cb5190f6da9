//! A `nats-server` of the test's own, with JetStream, on a free port and
//! with the configuration the test gives (TLS, authorization), stopped and
//! its files removed on drop.
//!
//! The binary is `$IDEM_NATS_SERVER`, else `nats-server` on the `PATH`, else
//! `/usr/sbin/nats-server`.

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

fn binary() -> Option<PathBuf> {
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
