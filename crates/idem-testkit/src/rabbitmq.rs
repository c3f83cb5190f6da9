//! A RabbitMQ node of the test's own that listens with TLS only, beside the
//! shared broker (which is never touched): its own node name, ports,
//! database, logs and Erlang cookie, all in a temporary directory, stopped on
//! drop. It boots in 10 to 20 seconds.
//!
//! The server script is `$IDEM_RABBITMQ_SERVER`, else
//! `/usr/lib/rabbitmq/bin/rabbitmq-server`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::nats::free_port;

/// A running RabbitMQ node with a TLS listener.
#[derive(Debug)]
pub struct RabbitTls {
    child: Child,
    port: u16,
    dir: tempfile::TempDir,
}

/// How long a node may take to boot.
const BOOT: Duration = Duration::from_secs(90);

impl RabbitTls {
    /// Starts a node whose only listener is TLS on a free port at 127.0.0.1,
    /// with `cert`/`key` as its certificate; `client_ca`, when given, is the
    /// CA client certificates must be signed by (and one is then required).
    /// The user `guest`/`guest` may log in (from 127.0.0.1). `None` (after
    /// [`missing_service`](crate::services::missing_service)) when RabbitMQ
    /// is not installed.
    pub async fn start(cert: &Path, key: &Path, client_ca: Option<&Path>) -> Option<Self> {
        let script = std::env::var_os("IDEM_RABBITMQ_SERVER")
            .map(PathBuf::from)
            .unwrap_or_else(|| "/usr/lib/rabbitmq/bin/rabbitmq-server".into());
        if !script.is_file() {
            crate::services::missing_service(
                "rabbitmq-server",
                &format!("no {} (set IDEM_RABBITMQ_SERVER)", script.display()),
            );
            return None;
        }
        let dir = tempfile::tempdir().expect("a directory for the RabbitMQ node");
        let port = free_port();
        let dist = free_port();
        let mut config = format!(
            "listeners.tcp = none\nlisteners.ssl.default = 127.0.0.1:{port}\nssl_options.certfile = {}\nssl_options.keyfile = {}\nloopback_users = none\n",
            cert.display(),
            key.display()
        );
        match client_ca {
            Some(ca) => config.push_str(&format!(
                "ssl_options.cacertfile = {}\nssl_options.verify = verify_peer\nssl_options.fail_if_no_peer_cert = true\n",
                ca.display()
            )),
            None => config.push_str("ssl_options.verify = verify_none\nssl_options.fail_if_no_peer_cert = false\n"),
        }
        let file = |name: &str, text: &str| -> PathBuf {
            let path = dir.path().join(name);
            std::fs::write(&path, text).expect("write a RabbitMQ file");
            path
        };
        let conf = file("rabbitmq.conf", &config);
        let plugins = file("enabled_plugins", "[].\n");
        let env = file("rabbitmq-env.conf", "");
        for sub in ["home", "mnesia", "log"] {
            std::fs::create_dir_all(dir.path().join(sub)).expect("a RabbitMQ directory");
        }
        let log = std::fs::File::create(dir.path().join("out.log")).expect("the node's log");
        let node = format!("idemtls{port}@localhost");
        let mut command = Command::new(script);
        command
            .env("HOME", dir.path().join("home"))
            .env("RABBITMQ_CONF_ENV_FILE", env)
            .env("RABBITMQ_NODENAME", &node)
            .env("RABBITMQ_NODE_IP_ADDRESS", "127.0.0.1")
            .env("RABBITMQ_DIST_PORT", dist.to_string())
            .env("ERL_EPMD_ADDRESS", "127.0.0.1")
            .env("RABBITMQ_MNESIA_BASE", dir.path().join("mnesia"))
            .env("RABBITMQ_LOG_BASE", dir.path().join("log"))
            .env("RABBITMQ_CONFIG_FILE", conf)
            .env("RABBITMQ_ENABLED_PLUGINS_FILE", plugins)
            .env("RABBITMQ_PID_FILE", dir.path().join("pid"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("the log, twice"))
            .stderr(log);
        // Its own process group, so the node and the helpers Erlang starts
        // stop together.
        std::os::unix::process::CommandExt::process_group(&mut command, 0);
        let child = command.spawn().expect("start rabbitmq-server");
        let mut node = Self { child, port, dir };
        let deadline = Instant::now() + BOOT;
        loop {
            if tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_ok()
            {
                return Some(node);
            }
            if let Ok(Some(status)) = node.child.try_wait() {
                panic!("rabbitmq-server exited ({status}):\n{}", node.log());
            }
            assert!(
                Instant::now() < deadline,
                "the RabbitMQ node did not listen within {BOOT:?}:\n{}",
                node.log()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The TLS port, at 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// What the node printed so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("out.log")).unwrap_or_default()
    }
}

impl Drop for RabbitTls {
    fn drop(&mut self) {
        let group = format!("-{}", self.child.id());
        let _ = Command::new("kill").args(["-TERM", "--", &group]).status();
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = Command::new("kill").args(["-KILL", "--", &group]).status();
        let _ = self.child.wait();
    }
}
