//! NATS over TLS with credentials, against a `nats-server` of each test's
//! own (TLS only, with users or a token), with certificates made on the
//! spot: the right CA and password consume effectively once; no TLS, the
//! wrong CA and the wrong password each fail with an error that says so,
//! and the password is never printed.

mod consumer_support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream;
use consumer_support::{Bank, Running, SqliteBank, config};
use idem_broker::consume::{Consumer, KeyRule, KeySource, Source, SourceOptions, Transport};
use idem_testkit::nats::NatsServer;
use idem_testkit::tls::TlsFiles;

const PASSWORD: &str = "pw-Kq9vX2-never-printed";

/// A TLS-only server whose one user is `app` with [`PASSWORD`].
async fn tls_server(files: &TlsFiles, authorization: &str) -> Option<NatsServer> {
    NatsServer::start(&format!(
        "tls {{ cert_file: {:?}, key_file: {:?}, timeout: 2 }}\n{authorization}\n",
        files.server_cert.display().to_string(),
        files.server_key.display().to_string(),
    ))
    .await
}

fn users() -> String {
    format!("authorization {{ users = [ {{ user: app, password: {PASSWORD:?} }} ] }}")
}

/// A stream `ORDERS` on `orders`, and the same keyed message published twice.
async fn orders(files: &TlsFiles, port: u16, auth: async_nats::ConnectOptions) {
    let client = auth
        .require_tls(true)
        .add_root_certificates(files.ca.clone())
        .connect(format!("tls://127.0.0.1:{port}"))
        .await
        .expect("the test's own client connects");
    let js = jetstream::new(client);
    js.create_stream(jetstream::stream::Config {
        name: "ORDERS".into(),
        subjects: vec!["orders".into()],
        // inside the dedupe window, so the consumer's start-up check passes
        max_age: Duration::from_secs(24 * 3600),
        ..jetstream::stream::Config::default()
    })
    .await
    .expect("create the stream");
    for _ in 0..2 {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert("Idem-Key", "order-1");
        js.publish_with_headers("orders", headers, br#"{"amount": 10}"#.to_vec().into())
            .await
            .expect("publish")
            .await
            .expect("publish acknowledged");
    }
}

async fn consume_once(source: &Source) {
    let bank = SqliteBank::start().await.expect("sqlite");
    let transport = source
        .connect(SourceOptions::default())
        .await
        .unwrap_or_else(|e| panic!("connect to {source}: {e}"));
    let consumer = Consumer::new(
        transport,
        bank.apply(false),
        config(KeyRule::new(KeySource::Header("Idem-Key".into()))),
    );
    let running = Running::start(consumer.stats(), |stop| consumer.run(stop));
    running
        .until("applied", |s| s.applied + s.replayed >= 2)
        .await;
    let stats = running.stop().await;
    assert_eq!(bank.ledger().await, ["order-1"], "{stats:?}");
    assert_eq!(stats.applied, 1, "{stats:?}");
}

async fn connect_error(source: &str) -> String {
    let source: Source = source.parse().expect("the source parses");
    let result = tokio::time::timeout(
        Duration::from_secs(20),
        source.connect(SourceOptions::default()),
    )
    .await
    .expect("a refusal, not a hang");
    match result {
        Ok(mut transport) => {
            let _ = transport.receive().await;
            panic!("{source} should not connect")
        }
        Err(error) => chain(&error),
    }
}

/// An error and its sources, as `idem forward` prints them.
fn chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut next = error.source();
    while let Some(source) = next {
        text.push_str(": ");
        text.push_str(&source.to_string());
        next = source.source();
    }
    text
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_right_ca_and_password_consume_once() {
    let files = TlsFiles::generate();
    let Some(server) = tls_server(&files, &users()).await else {
        return;
    };
    let auth = async_nats::ConnectOptions::new().user_and_password("app".into(), PASSWORD.into());
    orders(&files, server.port(), auth).await;
    let source: Source = format!(
        "tls://app:{PASSWORD}@127.0.0.1:{}/ORDERS/worker?tls_ca={}",
        server.port(),
        files.ca.display()
    )
    .parse()
    .expect("the source parses");
    assert!(!source.to_string().contains(PASSWORD), "{source}");
    assert!(!format!("{source:?}").contains(PASSWORD), "{source:?}");
    consume_once(&source).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_and_a_client_certificate_consume_once() {
    let files = TlsFiles::generate();
    let config = format!(
        "tls {{ cert_file: {:?}, key_file: {:?}, ca_file: {:?}, verify: true, timeout: 2 }}\nauthorization {{ token: {PASSWORD:?} }}\n",
        files.server_cert.display().to_string(),
        files.server_key.display().to_string(),
        files.ca.display().to_string(),
    );
    let Some(server) = NatsServer::start(&config).await else {
        return;
    };
    let auth = async_nats::ConnectOptions::new()
        .token(PASSWORD.into())
        .add_client_certificate(files.client_cert.clone(), files.client_key.clone());
    orders(&files, server.port(), auth).await;
    let source: Source = format!(
        "nats://127.0.0.1:{}/ORDERS/worker?tls=true&tls_ca={}&tls_cert={}&tls_key={}&token={PASSWORD}",
        server.port(),
        files.ca.display(),
        files.client_cert.display(),
        files.client_key.display(),
    )
    .parse()
    .expect("the source parses");
    assert!(!source.to_string().contains(PASSWORD), "{source}");
    consume_once(&source).await;

    // Without the client certificate the server refuses the handshake.
    let error = connect_error(&format!(
        "nats://127.0.0.1:{}/ORDERS/worker?tls=true&tls_ca={}&token={PASSWORD}",
        server.port(),
        files.ca.display(),
    ))
    .await;
    assert!(!error.contains(PASSWORD), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_nkey_seed_file_consumes_once() {
    let files = TlsFiles::generate();
    let user = nkeys::KeyPair::new_user();
    let seed = files.dir().join("user.nk");
    std::fs::write(&seed, user.seed().expect("a seed")).expect("write the seed");
    let authorization = format!(
        "authorization {{ users = [ {{ nkey: {:?} }} ] }}",
        user.public_key()
    );
    let Some(server) = tls_server(&files, &authorization).await else {
        return;
    };
    let auth = async_nats::ConnectOptions::new().nkey(user.seed().expect("a seed"));
    orders(&files, server.port(), auth).await;
    let source: Source = format!(
        "tls://127.0.0.1:{}/ORDERS/worker?tls_ca={}&nkey={}",
        server.port(),
        files.ca.display(),
        seed.display(),
    )
    .parse()
    .expect("the source parses");
    consume_once(&source).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_publisher_reaches_the_stream_over_tls_with_a_password() {
    use idem::IdempotencyKey;
    use idem_broker::publish::{self, Destination, Message, Publish};

    let files = TlsFiles::generate();
    let Some(server) = tls_server(&files, &users()).await else {
        return;
    };
    let auth = async_nats::ConnectOptions::new().user_and_password("app".into(), PASSWORD.into());
    orders(&files, server.port(), auth.clone()).await;
    let to: Destination = format!(
        "tls://app:{PASSWORD}@127.0.0.1:{}/orders?tls_ca={}",
        server.port(),
        files.ca.display()
    )
    .parse()
    .expect("the destination parses");
    assert!(!to.redacted().contains(PASSWORD), "{}", to.redacted());
    assert_eq!(to.to_string().parse::<Destination>().unwrap(), to);
    let publisher = publish::connect(&to)
        .await
        .unwrap_or_else(|e| panic!("publish over TLS: {}", chain(&e)));
    let message = Message::new(IdempotencyKey::new("order-2").unwrap(), b"{}".to_vec());
    publisher.publish(&message).await.expect("published");

    let client = auth
        .require_tls(true)
        .add_root_certificates(files.ca.clone())
        .connect(format!("tls://127.0.0.1:{}", server.port()))
        .await
        .expect("the test's own client connects");
    let mut stream = jetstream::new(client).get_stream("ORDERS").await.unwrap();
    assert_eq!(stream.info().await.unwrap().state.messages, 3);

    let wrong: Destination = format!(
        "tls://app:wrong-{PASSWORD}@127.0.0.1:{}/orders?tls_ca={}",
        server.port(),
        files.ca.display()
    )
    .parse()
    .unwrap();
    let error = match publish::connect(&wrong).await {
        Ok(_) => panic!("the wrong password connected"),
        Err(error) => chain(&error),
    };
    assert!(error.contains("authorization failed"), "{error}");
    assert!(!error.contains(PASSWORD), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_tls_against_a_tls_only_server_says_tls_is_required() {
    let files = TlsFiles::generate();
    let Some(server) = tls_server(&files, &users()).await else {
        return;
    };
    let error = connect_error(&format!(
        "nats://app:{PASSWORD}@127.0.0.1:{}/ORDERS/worker",
        server.port()
    ))
    .await;
    assert!(error.contains("requires TLS"), "{error}");
    assert!(error.contains("tls://"), "{error}");
    assert!(!error.contains(PASSWORD), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_wrong_ca_says_the_certificate_did_not_verify() {
    let files = TlsFiles::generate();
    let Some(server) = tls_server(&files, &users()).await else {
        return;
    };
    let error = connect_error(&format!(
        "tls://app:{PASSWORD}@127.0.0.1:{}/ORDERS/worker?tls_ca={}",
        server.port(),
        files.other_ca.display()
    ))
    .await;
    assert!(error.contains("certificate did not verify"), "{error}");
    assert!(!error.contains(PASSWORD), "{error}");

    let missing = connect_error(&format!(
        "tls://127.0.0.1:{}/ORDERS/worker?tls_ca=/nonexistent/ca.pem",
        server.port()
    ))
    .await;
    assert!(missing.contains("/nonexistent/ca.pem"), "{missing}");
}

/// Everything logged while connecting, on this thread (a current-thread
/// runtime keeps the client's tasks here too).
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn the_wrong_password_says_authorization_failed_and_is_never_printed() {
    let files = TlsFiles::generate();
    let Some(server) = tls_server(&files, &users()).await else {
        return;
    };
    let wrong = "wrong-Zt4-password";
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_writer(move || writer.clone())
        .finish();
    let guard = tracing::subscriber::set_default(subscriber);
    let text = format!(
        "tls://app:{wrong}@127.0.0.1:{}/ORDERS/worker?tls_ca={}",
        server.port(),
        files.ca.display()
    );
    let source: Source = text.parse().expect("the source parses");
    tracing::info!(%source, "consuming");
    let error = connect_error(&text).await;
    drop(guard);
    let logs = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    assert!(error.contains("authorization failed"), "{error}");
    for printed in [&error, &source.to_string(), &format!("{source:?}"), &logs] {
        assert!(!printed.contains(wrong), "{printed}");
    }
    assert!(logs.contains("consuming"), "{logs}");
}

/// `.creds` files under operator mode: the server trusts an operator and
/// knows its accounts (a memory resolver preloaded with their JWTs); a user
/// proves who it is with its JWT, signed by its account, and its NKey seed.
mod creds {
    use super::*;
    use idem::IdempotencyKey;
    use idem_broker::publish::{self, Destination, Message, Publish};
    use idem_testkit::nats::{Account, Operator, User};

    /// A TLS server in operator mode that knows `accounts` of `operator`.
    async fn operator_server(
        files: &TlsFiles,
        operator: &Operator,
        accounts: &[&Account],
    ) -> Option<NatsServer> {
        NatsServer::start_operator_mode(
            operator,
            accounts,
            &format!(
                "tls {{ cert_file: {:?}, key_file: {:?}, timeout: 2 }}\n",
                files.server_cert.display().to_string(),
                files.server_key.display().to_string(),
            ),
        )
        .await
    }

    /// Writes `user`'s `.creds` file as `name` beside the certificates.
    fn creds_file(files: &TlsFiles, user: &User, name: &str) -> std::path::PathBuf {
        let path = files.dir().join(name);
        std::fs::write(&path, user.creds()).expect("write the creds file");
        path
    }

    fn source(server: &NatsServer, files: &TlsFiles, creds: &std::path::Path) -> String {
        format!(
            "tls://127.0.0.1:{}/ORDERS/worker?tls_ca={}&creds={}",
            server.port(),
            files.ca.display(),
            creds.display(),
        )
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_creds_file_consumes_once_and_publishes() {
        let files = TlsFiles::generate();
        let operator = Operator::new("idem-test");
        let account = operator.account("billing");
        let Some(server) = operator_server(&files, &operator, &[&account]).await else {
            return;
        };
        let user = account.user("worker");
        let auth = async_nats::ConnectOptions::new()
            .credentials(&user.creds())
            .expect("the creds parse");
        orders(&files, server.port(), auth.clone()).await;
        let creds = creds_file(&files, &user, "worker.creds");
        let source: Source = source(&server, &files, &creds)
            .parse()
            .expect("the source parses");
        consume_once(&source).await;

        let to: Destination = format!(
            "tls://127.0.0.1:{}/orders?tls_ca={}&creds={}",
            server.port(),
            files.ca.display(),
            creds.display(),
        )
        .parse()
        .expect("the destination parses");
        let publisher = publish::connect(&to)
            .await
            .unwrap_or_else(|e| panic!("publish with creds: {}\n{}", chain(&e), server.log()));
        let message = Message::new(IdempotencyKey::new("order-2").unwrap(), b"{}".to_vec());
        publisher.publish(&message).await.expect("published");

        let client = auth
            .require_tls(true)
            .add_root_certificates(files.ca.clone())
            .connect(format!("tls://127.0.0.1:{}", server.port()))
            .await
            .expect("the test's own client connects");
        let mut stream = jetstream::new(client).get_stream("ORDERS").await.unwrap();
        assert_eq!(stream.info().await.unwrap().state.messages, 3);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_user_of_another_account_or_operator_is_refused_with_authorization_failed() {
        let files = TlsFiles::generate();
        let operator = Operator::new("idem-test");
        let account = operator.account("billing");
        let Some(server) = operator_server(&files, &operator, &[&account]).await else {
            return;
        };
        // An account the server was never told of, of the same operator,
        // and an account of an operator it does not trust.
        let unknown = operator.account("unknown");
        let stranger = Operator::new("elsewhere").account("billing");
        for (name, user) in [
            ("unknown-account.creds", unknown.user("worker")),
            ("other-operator.creds", stranger.user("worker")),
        ] {
            let creds = creds_file(&files, &user, name);
            let error = connect_error(&source(&server, &files, &creds)).await;
            assert!(error.contains("authorization failed"), "{name}: {error}");
            assert!(!error.contains(&user.seed()), "{error}");
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_unreadable_creds_file_is_an_error_that_names_it() {
        let files = TlsFiles::generate();
        let operator = Operator::new("idem-test");
        let account = operator.account("billing");
        let Some(server) = operator_server(&files, &operator, &[&account]).await else {
            return;
        };
        let missing = files.dir().join("missing.creds");
        let error = connect_error(&source(&server, &files, &missing)).await;
        assert!(error.contains("creds file"), "{error}");
        assert!(error.contains(&missing.display().to_string()), "{error}");

        // A file that holds no user JWT: the seed alone.
        let user = account.user("worker");
        let garbled = files.dir().join("seed-only.creds");
        std::fs::write(&garbled, user.seed()).expect("write the file");
        let error = connect_error(&source(&server, &files, &garbled)).await;
        assert!(error.contains(&garbled.display().to_string()), "{error}");
        assert!(error.contains("JWT"), "{error}");
        assert!(!error.contains(&user.seed()), "{error}");
    }
}
