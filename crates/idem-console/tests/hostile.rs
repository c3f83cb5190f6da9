//! The console and the admin listener against hostile clients: requests
//! sent under a foreign `Host` (DNS rebinding) by python3's `http.client`
//! and by curl, sign-ins without the form's CSRF token, sessions that must
//! not be the token and must end, token guessing, and the `Secure` flag of
//! the cookies over TLS.

mod common;

use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use common::{Answer, Client, Kind, Served, TestStore, token};
use idem::{IdempotencyKey, RecordStore, Scope};
use idem_console::{Access, Console, SessionLimits};
use idem_gateway::admin::AllowedHosts;
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;

/// Sends each `(method, path, JSON body)` of `requests` to `127.0.0.1:port`
/// with python3's `http.client`, under `Host: host` and `Origin:
/// http://host`; the status, content type and body of each answer.
async fn python(port: u16, host: &str, requests: &[(&str, String, Option<Value>)]) -> Vec<Value> {
    const SCRIPT: &str = r#"
import http.client, json, sys
port, host = int(sys.argv[1]), sys.argv[2]
out = []
for method, path, body in json.load(sys.stdin):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    c.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
    c.putheader("Host", host)
    c.putheader("Origin", "http://" + host)
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        c.putheader("Content-Type", "application/json")
        c.putheader("Content-Length", str(len(data)))
    c.endheaders(data)
    r = c.getresponse()
    out.append({"status": r.status, "type": r.getheader("Content-Type"),
                "body": r.read().decode("utf-8", "replace")})
    c.close()
print(json.dumps(out))
"#;
    let mut child = tokio::process::Command::new("python3")
        .args(["-c", SCRIPT, &port.to_string(), host])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3 runs");
    let input = json!(
        requests
            .iter()
            .map(|(method, path, body)| json!([method, path, body]))
            .collect::<Vec<_>>()
    );
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(input.to_string().as_bytes()).await.unwrap();
    drop(stdin);
    let output = child.wait_with_output().await.unwrap();
    assert!(
        output.status.success(),
        "python3 failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice::<Vec<Value>>(&output.stdout).unwrap()
}

/// Runs curl with `args`; its standard output (`-i`: the head and the body).
async fn curl(args: &[&str]) -> String {
    let output = tokio::process::Command::new("curl")
        .args(["-sS", "--max-time", "10"])
        .args(args)
        .output()
        .await
        .expect("curl runs");
    assert!(
        output.status.success(),
        "curl {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// The status of a curl `-i` answer (the last head's, after any `100`).
fn curl_status(answer: &str) -> u16 {
    answer
        .split("\r\n\r\n")
        .filter(|part| part.starts_with("HTTP/"))
        .last()
        .and_then(|head| head.split(' ').nth(1))
        .and_then(|status| status.parse().ok())
        .unwrap_or(0)
}

/// The JSON body to evict `pay-1`, as the record is now.
async fn eviction(client: &Client, base: &str) -> Value {
    let shown = client
        .get(
            &format!("{base}/api/v1/records/one?scope=payments&key=pay-1"),
            &[],
        )
        .await;
    assert_eq!(shown.status, StatusCode::OK, "{}", shown.body);
    let shown = shown.json();
    json!({
        "scope": "payments", "key": "pay-1", "token": shown["token"],
        "updated_at_ms": shown["updated_at_ms"], "actor": "mallory",
    })
}

async fn still_there(t: &TestStore) -> bool {
    let scope = Scope::new("payments").unwrap();
    let key = IdempotencyKey::new("pay-1").unwrap();
    t.store.get(&scope, &key).await.unwrap().is_some()
}

fn assert_refused_host(answer: &Value, host: &str) {
    assert_eq!(answer["status"], 421, "{answer}");
    assert_eq!(answer["type"], "application/problem+json", "{answer}");
    let body = answer["body"].as_str().unwrap();
    assert!(!body.contains("paid-secret"), "the answer leaked: {body}");
    let problem: Value = serde_json::from_str(body).unwrap();
    assert_eq!(problem["host"], host);
    let name = host.split(':').next().unwrap();
    let detail = problem["detail"].as_str().unwrap();
    assert!(
        detail.contains(&format!("--allow-host {name}")),
        "says which flag allows it: {detail}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_refuses_a_foreign_host_before_anything_runs() {
    let t = TestStore::fresh(Kind::Sqlite).await.unwrap();
    t.record("payments", "pay-1", Some("paid-secret")).await;
    let console = Console::new(t.store.clone(), Access::open())
        .allow_hosts(AllowedHosts::parse(["console.internal"]).unwrap());
    let served = Served::console(console).await;
    let port = served.addr.port();
    let evict = eviction(&Client::new(), &served.url("")).await;
    let requests = [
        (
            "GET",
            "/api/v1/records/one?scope=payments&key=pay-1".to_owned(),
            None,
        ),
        (
            "GET",
            "/records/show?scope=payments&key=pay-1".to_owned(),
            None,
        ),
        (
            "POST",
            "/api/v1/records/evict".to_owned(),
            Some(evict.clone()),
        ),
        ("GET", "/nowhere".to_owned(), None),
    ];

    let evil = format!("evil.example:{port}");
    let answers = python(port, &evil, &requests).await;
    assert_eq!(answers.len(), requests.len());
    for answer in &answers {
        assert_refused_host(answer, &evil);
    }
    assert!(still_there(&t).await, "the key it tried to evict is kept");

    // Under the console's own names the same script reads the record.
    for host in [format!("127.0.0.1:{port}"), "console.internal".to_owned()] {
        let answers = python(port, &host, &requests[..1]).await;
        assert_eq!(answers[0]["status"], 200, "{host}: {}", answers[0]);
        assert!(answers[0]["body"].as_str().unwrap().contains("paid-secret"));
    }
    assert!(still_there(&t).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_listener_with_the_console_refuses_a_foreign_host() {
    let t = TestStore::fresh(Kind::Sqlite).await.unwrap();
    t.record("payments", "pay-1", Some("paid-secret")).await;
    // As `idem serve --admin-listen 127.0.0.1:…` mounts it: no token.
    let hosts = AllowedHosts::loopback();
    let console = Console::new(t.store.clone(), Access::open()).allow_hosts(hosts.clone());
    let admin = idem_gateway::admin::start_admin_with_hosts(
        "127.0.0.1:0".parse().unwrap(),
        t.store.clone(),
        None,
        console.router(),
        hosts,
    )
    .await
    .unwrap();
    let addr = admin.local_addr();
    let base = format!("http://{addr}");
    let evict = eviction(&Client::new(), &base).await.to_string();
    let evil = format!("evil.example:{}", addr.port());
    let host = format!("Host: {evil}");
    let origin = format!("Origin: http://{evil}");
    let read = format!("{base}/api/v1/records/one?scope=payments&key=pay-1");
    let evict_url = format!("{base}/api/v1/records/evict");
    let metrics = format!("{base}/metrics");

    for args in [
        vec!["-i", "-H", &host, "-H", &origin, &read],
        vec![
            "-i",
            "-H",
            &host,
            "-H",
            &origin,
            "-H",
            "Content-Type: application/json",
            "--data-binary",
            &evict,
            &evict_url,
        ],
        vec!["-i", "-H", &host, &metrics],
    ] {
        let answer = curl(&args).await;
        assert_eq!(curl_status(&answer), 421, "{answer}");
        assert!(!answer.contains("paid-secret"), "{answer}");
        assert!(answer.contains("--allow-host evil.example"), "{answer}");
    }
    assert!(still_there(&t).await, "the key it tried to evict is kept");

    let answer = curl(&["-i", &read]).await;
    assert_eq!(curl_status(&answer), 200, "{answer}");
    assert!(answer.contains("paid-secret"));
    admin.stop().await;
}

/// A browser at the sign-in form: its CSRF cookie and the form's field.
async fn sign_in_form(client: &Client, served: &Served) -> String {
    let form = client.get(&served.url("/login"), &[]).await;
    assert_eq!(form.status, StatusCode::OK);
    let csrf = form.cookie("idem_console_csrf").expect("a CSRF cookie");
    assert!(
        form.body
            .contains(&format!(r#"name="csrf" value="{csrf}""#)),
        "the form carries it: {}",
        form.body
    );
    csrf
}

async fn sign_in(client: &Client, served: &Served, csrf: &str, token: &str) -> Answer {
    client
        .post_form(
            &served.url("/login"),
            &[("cookie", &format!("idem_console_csrf={csrf}"))],
            &[("token", token), ("next", "/records"), ("csrf", csrf)],
        )
        .await
}

fn set_cookie_line(answer: &Answer, name: &str) -> String {
    answer
        .headers
        .get_all("set-cookie")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find(|v| v.starts_with(&format!("{name}=")))
        .unwrap_or_else(|| panic!("no {name} cookie"))
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sign_in_needs_the_forms_csrf_token_and_opens_a_session_that_ends() {
    let t = TestStore::fresh(Kind::Sqlite).await.unwrap();
    let access = Access::with_tokens(Some(token("op-token")), Some(token("ro-token")));
    let console = Console::new(t.store.clone(), access)
        .clock(Arc::new(t.clock.clone()))
        .session_limits(SessionLimits {
            idle: Duration::from_secs(600),
            absolute: Duration::from_secs(3600),
        });
    let served = Served::console(console).await;
    let client = Client::new();
    let csrf = sign_in_form(&client, &served).await;
    let csrf_cookie = format!("idem_console_csrf={csrf}");
    let with_cookie = [("cookie", csrf_cookie.as_str())];

    // Without the field, with another value, without the cookie, from
    // another site: refused, and no session.
    for (headers, form) in [
        (&with_cookie[..], vec![("token", "op-token")]),
        (
            &with_cookie[..],
            vec![("token", "op-token"), ("csrf", "0123456789abcdef")],
        ),
        (
            &[][..],
            vec![("token", "op-token"), ("csrf", csrf.as_str())],
        ),
        (
            &[with_cookie[0], ("origin", "http://evil.example")][..],
            vec![("token", "op-token"), ("csrf", csrf.as_str())],
        ),
    ] {
        let refused = client
            .post_form(&served.url("/login"), headers, &form)
            .await;
        assert_eq!(refused.status, StatusCode::FORBIDDEN, "{form:?}");
        assert!(refused.cookie("idem_console_session").is_none());
    }

    // The session id is random, not the token, and its cookie is
    // HttpOnly, SameSite=Strict and not Secure over plain HTTP.
    let signed = sign_in(&client, &served, &csrf, "op-token").await;
    assert_eq!(signed.status, StatusCode::SEE_OTHER, "{}", signed.body);
    let line = set_cookie_line(&signed, "idem_console_session");
    assert!(
        line.contains("HttpOnly") && line.contains("SameSite=Strict") && line.contains("Path=/")
    );
    assert!(!line.contains("Secure"), "{line}");
    let session = signed.cookie("idem_console_session").unwrap();
    assert!(!session.contains("op-token"));
    assert!(session.len() >= 32 && session.bytes().all(|b| b.is_ascii_hexdigit()));
    let again = sign_in(&client, &served, &csrf, "op-token").await;
    assert_ne!(again.cookie("idem_console_session").unwrap(), session);

    let page = |cookie: String| {
        let client = client.clone();
        let url = served.url("/records");
        async move { client.get(&url, &[("cookie", &cookie)]).await.status }
    };
    let cookie = format!("idem_console_session={session}");
    assert_eq!(page(cookie.clone()).await, StatusCode::OK);
    // The token itself is no session.
    for forged in [
        "idem_console_session=op-token".to_owned(),
        "idem_console_token=op-token".to_owned(),
    ] {
        assert_eq!(page(forged).await, StatusCode::SEE_OTHER);
    }

    // Idle for its limit: ended.
    t.clock.advance(Duration::from_secs(599));
    assert_eq!(page(cookie.clone()).await, StatusCode::OK);
    t.clock.advance(Duration::from_secs(600));
    assert_eq!(page(cookie).await, StatusCode::SEE_OTHER, "idle too long");

    // Used all along: ended at its absolute bound.
    let kept = sign_in(&client, &served, &csrf, "ro-token").await;
    let kept = format!(
        "idem_console_session={}",
        kept.cookie("idem_console_session").unwrap()
    );
    for _ in 0..6 {
        t.clock.advance(Duration::from_secs(590));
        assert_eq!(page(kept.clone()).await, StatusCode::OK);
    }
    t.clock.advance(Duration::from_secs(60));
    assert_eq!(page(kept).await, StatusCode::SEE_OTHER, "past its bound");

    // Signed out: the cookie a client kept works no more.
    let out = sign_in(&client, &served, &csrf, "op-token").await;
    let out = format!(
        "idem_console_session={}",
        out.cookie("idem_console_session").unwrap()
    );
    assert_eq!(page(out.clone()).await, StatusCode::OK);
    let signed_out = client
        .post_form(&served.url("/logout"), &[("cookie", &out)], &[])
        .await;
    assert_eq!(signed_out.status, StatusCode::SEE_OTHER);
    assert!(set_cookie_line(&signed_out, "idem_console_session").contains("Max-Age=0"));
    assert_eq!(page(out).await, StatusCode::SEE_OTHER);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thirty_wrong_tokens_cannot_all_be_tried() {
    let t = TestStore::fresh(Kind::Sqlite).await.unwrap();
    let access = Access::with_tokens(Some(token("op-token")), None);
    let console = Console::new(t.store.clone(), access).clock(Arc::new(t.clock.clone()));
    let served = Served::console(console).await;
    let client = Client::new();
    let csrf = sign_in_form(&client, &served).await;

    let mut statuses = Vec::new();
    for guess in 0..30 {
        let answer = sign_in(&client, &served, &csrf, &format!("guess-{guess}")).await;
        if answer.status == StatusCode::TOO_MANY_REQUESTS {
            let after: u64 = answer.headers["retry-after"]
                .to_str()
                .unwrap()
                .parse()
                .unwrap();
            assert!(after >= 1);
        }
        statuses.push(answer.status.as_u16());
    }
    let tried = statuses.iter().filter(|s| **s == 401).count();
    let refused = statuses.iter().filter(|s| **s == 429).count();
    assert_eq!((tried, refused), (5, 25), "{statuses:?}");

    // The right token is not even tried until the wait is over.
    let early = sign_in(&client, &served, &csrf, "op-token").await;
    assert_eq!(early.status, StatusCode::TOO_MANY_REQUESTS);
    assert!(early.cookie("idem_console_session").is_none());
    t.clock.advance(Duration::from_secs(2));
    let signed = sign_in(&client, &served, &csrf, "op-token").await;
    assert_eq!(signed.status, StatusCode::SEE_OTHER, "{}", signed.body);

    // A wrong bearer token is a guess too, counted with the sign-ins: the
    // next wrong one must wait 1 s after the last failure, then 2 s.
    let url = served.url("/api/v1/records");
    let wrong = client.get(&url, &[("authorization", "Bearer nope")]).await;
    wrong.problem(StatusCode::UNAUTHORIZED);
    let wait = client.get(&url, &[("authorization", "Bearer nope")]).await;
    let detail = wait.problem(StatusCode::TOO_MANY_REQUESTS);
    assert!(detail.contains("not checked"), "{detail}");
    assert_eq!(wait.headers["retry-after"], "2");
    let right = client
        .get(&url, &[("authorization", "Bearer op-token")])
        .await;
    assert_eq!(right.status, StatusCode::TOO_MANY_REQUESTS);
    t.clock.advance(Duration::from_secs(2));
    let right = client
        .get(&url, &[("authorization", "Bearer op-token")])
        .await;
    assert_eq!(right.status, StatusCode::OK, "{}", right.body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_tls_the_cookies_are_secure() {
    let t = TestStore::fresh(Kind::Sqlite).await.unwrap();
    let files = idem_testkit::tls::TlsFiles::generate();
    let (config, _reloader) = idem_gateway::ListenerTls {
        cert: files.server_cert.clone(),
        key: files.server_key.clone(),
        client_ca: None,
    }
    .load()
    .unwrap();
    let access = Access::with_tokens(Some(token("op-token")), None);
    let console = Console::new(t.store.clone(), access);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(idem_console::serve_tls(listener, console, config, async {
        let _ = stopped.await;
    }));

    let ca = files.ca.display().to_string();
    let base = format!("https://localhost:{port}");
    let resolve = format!("localhost:{port}:127.0.0.1");
    let jar = files.dir().join("cookies.txt").display().to_string();
    let form = curl(&[
        "-i",
        "--cacert",
        &ca,
        "--resolve",
        &resolve,
        "-c",
        &jar,
        &format!("{base}/login"),
    ])
    .await;
    assert_eq!(curl_status(&form), 200, "{form}");
    let csrf_line = form
        .lines()
        .find(|l| {
            l.to_ascii_lowercase()
                .starts_with("set-cookie: idem_console_csrf=")
        })
        .unwrap_or_else(|| panic!("{form}"));
    assert!(csrf_line.contains("; Secure"), "{csrf_line}");
    let csrf = csrf_line
        .split_once('=')
        .unwrap()
        .1
        .split(';')
        .next()
        .unwrap()
        .to_owned();

    let signed = curl(&[
        "-i",
        "--cacert",
        &ca,
        "--resolve",
        &resolve,
        "-b",
        &jar,
        "--data-urlencode",
        "token=op-token",
        "--data-urlencode",
        &format!("csrf={csrf}"),
        &format!("{base}/login"),
    ])
    .await;
    assert_eq!(curl_status(&signed), 303, "{signed}");
    let session_line = signed
        .lines()
        .find(|l| {
            l.to_ascii_lowercase()
                .starts_with("set-cookie: idem_console_session=")
        })
        .unwrap_or_else(|| panic!("{signed}"));
    assert!(
        session_line.contains("; Secure")
            && session_line.contains("HttpOnly")
            && session_line.contains("SameSite=Strict"),
        "{session_line}"
    );
    let _ = stop.send(());
    task.await.unwrap().unwrap();
}
