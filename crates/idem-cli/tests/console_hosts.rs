//! `idem console` and `idem serve --admin-listen` as a user runs them,
//! asked by curl under a foreign `Host` (as a page that pointed its own name
//! at 127.0.0.1 would): refused, while the names given to `--allow-host`,
//! `IDEM_ALLOW_HOSTS` or `allow_hosts` in the config file are answered; and
//! `idem console --tls-cert` marks its sign-in cookies `Secure`.

mod common;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::store::{TestStore, sqlite_in};

/// A running `idem`, killed when dropped.
struct Running {
    child: Child,
    addr: SocketAddr,
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `idem <args>` with `env`, and waits for the stdout line that
/// starts with `prefix` followed by the address.
fn start(args: &[&str], env: &[(&str, &str)], prefix: &str) -> Running {
    let mut command = Command::new(env!("CARGO_BIN_EXE_idem"));
    for (name, _) in std::env::vars() {
        if name.starts_with("IDEM_") {
            command.env_remove(name);
        }
    }
    let mut child = command
        .args(args)
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("run idem");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let deadline = Instant::now() + Duration::from_secs(60);
    let addr = loop {
        assert!(Instant::now() < deadline, "idem {args:?} did not start");
        let Some(Ok(line)) = lines.next() else {
            panic!("idem {args:?} stopped: {:?}", child.wait());
        };
        if let Some(rest) = line.strip_prefix(prefix) {
            let addr = rest.split(['/', ' ']).next().unwrap();
            break addr.parse().unwrap();
        }
    };
    // Keep reading, so the child never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines.by_ref() {});
    Running { child, addr }
}

/// `curl -i` with `args`; the status and the whole answer.
fn curl(args: &[&str]) -> (u16, String) {
    let output = Command::new("curl")
        .args(["-sS", "-i", "--max-time", "10"])
        .args(args)
        .output()
        .expect("run curl");
    assert!(
        output.status.success(),
        "curl {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let answer = String::from_utf8_lossy(&output.stdout).into_owned();
    let status = answer
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, answer)
}

fn get(addr: SocketAddr, path: &str, host: Option<&str>) -> (u16, String) {
    let url = format!("http://{addr}{path}");
    match host {
        Some(host) => curl(&["-H", &format!("Host: {host}"), &url]),
        None => curl(&[&url]),
    }
}

#[test]
fn idem_console_answers_to_loopback_names_and_those_allowed_only() {
    let store = TestStore::sqlite();
    let prefix = "idem console: on http://";
    let console = start(
        &[
            "console",
            "--store",
            &store.url,
            "--listen",
            "127.0.0.1:0",
            "--allow-host",
            "console.internal",
        ],
        &[],
        prefix,
    );
    let (status, answer) = get(console.addr, "/api/v1/records", Some("evil.example"));
    assert_eq!(status, 421, "{answer}");
    assert!(answer.contains("--allow-host evil.example"), "{answer}");
    let (status, answer) = get(console.addr, "/", Some("evil.example:9300"));
    assert_eq!(status, 421, "{answer}");
    for host in [None, Some("localhost"), Some("console.internal:9300")] {
        let (status, answer) = get(console.addr, "/api/v1/records", host);
        assert_eq!(status, 200, "{host:?}: {answer}");
    }
    drop(console);

    let listed = start(
        &["console", "--store", &store.url, "--listen", "127.0.0.1:0"],
        &[("IDEM_ALLOW_HOSTS", "a.internal,*.ops.example")],
        prefix,
    );
    for (host, status) in [
        ("a.internal", 200),
        ("db.ops.example", 200),
        ("console.internal", 421),
    ] {
        let (got, answer) = get(listed.addr, "/api/v1/records", Some(host));
        assert_eq!(got, status, "{host}: {answer}");
    }
}

#[test]
fn idem_serve_admin_listener_answers_to_the_names_allowed_only() {
    let dir = tempfile::tempdir().unwrap();
    let store = sqlite_in(dir.path());
    let config = dir.path().join("idem.toml");
    std::fs::write(&config, "allow_hosts = [\"cfg.internal\"]\n").unwrap();
    let serve = |extra: &[&str]| {
        let mut args = vec![
            "serve",
            "--store",
            &store,
            "--upstream",
            "http://127.0.0.1:9",
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
            "--sweep-every",
            "off",
            "--spool",
            "off",
        ];
        args.extend_from_slice(extra);
        start(&args, &[], "idem serve: admin on http://")
    };

    let flagged = serve(&["--allow-host", "admin.internal"]);
    for path in ["/api/v1/records", "/metrics", "/records"] {
        let (status, answer) = get(flagged.addr, path, Some("evil.example"));
        assert_eq!(status, 421, "{path}: {answer}");
        assert!(answer.contains("--allow-host evil.example"), "{answer}");
    }
    for host in [None, Some("admin.internal")] {
        let (status, answer) = get(flagged.addr, "/api/v1/records", host);
        assert_eq!(status, 200, "{host:?}: {answer}");
    }
    drop(flagged);

    let filed = serve(&["--config", config.to_str().unwrap()]);
    let (status, answer) = get(filed.addr, "/api/v1/records", Some("cfg.internal"));
    assert_eq!(status, 200, "{answer}");
    let (status, answer) = get(filed.addr, "/api/v1/records", Some("admin.internal"));
    assert_eq!(status, 421, "{answer}");
}

#[test]
fn idem_console_over_tls_marks_its_cookies_secure() {
    let dir = tempfile::tempdir().unwrap();
    let store = sqlite_in(dir.path());
    let files = idem_testkit::tls::TlsFiles::generate();
    let token = dir.path().join("token");
    std::fs::write(&token, "op-token\n").unwrap();
    let console = start(
        &[
            "console",
            "--store",
            &store,
            "--listen",
            "127.0.0.1:0",
            "--token-file",
            token.to_str().unwrap(),
            "--tls-cert",
            files.server_cert.to_str().unwrap(),
            "--tls-key",
            files.server_key.to_str().unwrap(),
        ],
        &[],
        "idem console: on https://",
    );
    let port = console.addr.port();
    let resolve = format!("localhost:{port}:127.0.0.1");
    let url = format!("https://localhost:{port}/login");
    let ca = files.ca.to_str().unwrap();
    let (status, answer) = curl(&["--cacert", ca, "--resolve", &resolve, &url]);
    assert_eq!(status, 200, "{answer}");
    let cookie = answer
        .lines()
        .find(|line| {
            line.to_ascii_lowercase()
                .starts_with("set-cookie: idem_console_csrf=")
        })
        .unwrap_or_else(|| panic!("{answer}"));
    assert!(cookie.contains("; Secure"), "{cookie}");
}
