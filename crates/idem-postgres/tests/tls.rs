//! Connecting to a PostgreSQL that requires TLS and a password: verified TLS
//! works end to end; no TLS, a certificate from another authority and a wrong
//! password are each refused with a message that says which, and never with
//! the password in it.

use std::time::Duration;

use idem_core::{
    AtomicStore, Error, ErrorKind, Fingerprint, IdempotencyKey, Outcome, RecordState, RecordStore,
    Scope,
};
use idem_postgres::PgStore;
use idem_testkit::tls_postgres::TlsPostgres;
use sqlx::PgConnection;

/// The password of the server's `postgres` user; odd characters on purpose,
/// so that the URL must encode it.
const PASSWORD: &str = "s3cret-Pa55:word@/x";

fn scope() -> Scope {
    Scope::new("payments").unwrap()
}

async fn connect(url: &str) -> Result<PgStore, Error> {
    PgStore::builder(url)
        .acquire_timeout(Duration::from_secs(10))
        .max_connections(2)
        .connect()
        .await
}

fn kind(error: &Error) -> ErrorKind {
    match error {
        Error::Store(store) => store.kind(),
        other => panic!("not a store error: {other:?}"),
    }
}

/// The error's Display, Debug and every source's Display and Debug.
fn everything_printed(error: &Error) -> String {
    let mut text = format!("{error}\n{error:?}\n");
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        text.push_str(&format!("{cause}\n{cause:?}\n"));
        source = cause.source();
    }
    text
}

fn assert_no_password(printed: &str, password: &str) {
    assert!(
        !printed.contains(password),
        "the password appears in what the error prints:\n{printed}"
    );
    let encoded = password.replace(':', "%3A").replace('@', "%40");
    assert!(
        !printed.contains(&encoded),
        "the encoded password appears in what the error prints:\n{printed}"
    );
}

#[tokio::test]
async fn verified_tls_with_the_right_password_opens_a_store_that_applies_once() {
    let Some(server) = TlsPostgres::start(PASSWORD) else {
        return;
    };
    let store = connect(&server.verified_url())
        .await
        .unwrap_or_else(|e| panic!("{e}\nserver log:\n{}", server.log_text()));
    let key = IdempotencyKey::new("order-1").unwrap();
    let fp = Fingerprint::of_bytes(b"debit 10");
    let effect = async |conn: &mut PgConnection| -> sqlx::Result<Outcome> {
        let ssl: bool =
            sqlx::query_scalar("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
                .fetch_one(&mut *conn)
                .await?;
        Ok(Outcome::success(if ssl { "over TLS" } else { "in clear" }))
    };
    let first = store.apply(&scope(), &key, fp, effect).await.unwrap();
    assert!(!first.is_replay());
    assert_eq!(first.outcome().body, b"over TLS");
    let again = store
        .apply(
            &scope(),
            &key,
            fp,
            async |_: &mut PgConnection| -> sqlx::Result<Outcome> {
                panic!("a duplicate must not run the effect")
            },
        )
        .await
        .unwrap();
    assert!(again.is_replay());
    let record = store.get(&scope(), &key).await.unwrap().unwrap();
    assert_eq!(record.state, RecordState::Completed);

    // sslmode=require encrypts without checking the certificate, and
    // verify-ca checks the authority but not the host name.
    for query in [
        "sslmode=require".to_owned(),
        format!(
            "sslmode=verify-ca&sslrootcert={}",
            server.ca_file().display()
        ),
    ] {
        let url = server.url("127.0.0.1", PASSWORD, &query);
        let store = connect(&url)
            .await
            .unwrap_or_else(|e| panic!("{query}: {e}"));
        assert!(store.get(&scope(), &key).await.unwrap().is_some());
    }
}

#[tokio::test]
async fn without_tls_the_server_refuses_and_the_error_says_to_ask_for_tls() {
    let Some(server) = TlsPostgres::start(PASSWORD) else {
        return;
    };
    let url = server.url("127.0.0.1", PASSWORD, "sslmode=disable");
    let error = connect(&url).await.unwrap_err();
    assert_eq!(kind(&error), ErrorKind::Config, "{error}");
    let text = error.to_string();
    assert!(text.contains("requires TLS"), "{text}");
    assert!(text.contains("no encryption"), "{text}");
    assert!(text.contains("sslmode=require"), "{text}");
    assert_no_password(&everything_printed(&error), PASSWORD);
}

#[tokio::test]
async fn a_certificate_from_another_authority_is_refused_as_not_verified() {
    let Some(server) = TlsPostgres::start(PASSWORD) else {
        return;
    };
    for mode in ["verify-full", "verify-ca"] {
        let url = server.url(
            "localhost",
            PASSWORD,
            &format!(
                "sslmode={mode}&sslrootcert={}",
                server.other_ca_file().display()
            ),
        );
        let error = connect(&url).await.unwrap_err();
        assert_eq!(kind(&error), ErrorKind::Config, "{mode}: {error}");
        let text = error.to_string();
        assert!(
            text.contains("certificate") && text.contains("did not verify"),
            "{mode}: {text}"
        );
        assert!(text.contains("sslrootcert"), "{mode}: {text}");
        assert_no_password(&everything_printed(&error), PASSWORD);
    }
}

#[tokio::test]
async fn verify_full_checks_the_host_name_and_verify_ca_does_not() {
    let Some(server) = TlsPostgres::start(PASSWORD) else {
        return;
    };
    // The certificate names localhost, not 127.0.0.1.
    let query = |mode: &str| format!("sslmode={mode}&sslrootcert={}", server.ca_file().display());
    let url = server.url("127.0.0.1", PASSWORD, &query("verify-full"));
    let error = connect(&url).await.unwrap_err();
    assert_eq!(kind(&error), ErrorKind::Config, "{error}");
    let text = error.to_string();
    assert!(text.contains("did not verify"), "{text}");
    assert!(text.contains("host name"), "{text}");
    assert_no_password(&everything_printed(&error), PASSWORD);

    let url = server.url("127.0.0.1", PASSWORD, &query("verify-ca"));
    connect(&url).await.unwrap();
}

#[tokio::test]
async fn a_wrong_password_is_refused_as_failed_authentication_without_printing_it() {
    let Some(server) = TlsPostgres::start(PASSWORD) else {
        return;
    };
    let wrong = "Wr0ng-hunter2-Pa55";
    let url = server.url(
        "localhost",
        wrong,
        &format!(
            "sslmode=verify-full&sslrootcert={}",
            server.ca_file().display()
        ),
    );
    let error = connect(&url).await.unwrap_err();
    assert_eq!(kind(&error), ErrorKind::Config, "{error}");
    let text = error.to_string();
    assert!(text.contains("authentication failed"), "{text}");
    assert!(text.contains("user postgres"), "{text}");
    let printed = everything_printed(&error);
    assert_no_password(&printed, wrong);
    assert_no_password(&printed, PASSWORD);
}

#[tokio::test]
async fn the_password_may_come_from_a_passfile_named_in_the_url() {
    let Some(server) = TlsPostgres::start(PASSWORD) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let passfile = dir.path().join("pgpass");
    let escaped = PASSWORD.replace('\\', "\\\\").replace(':', "\\:");
    std::fs::write(
        &passfile,
        format!(
            "# comment\nelsewhere:5432:*:postgres:not-this-one\nlocalhost:{}:*:postgres:{escaped}\n",
            server.port()
        ),
    )
    .unwrap();
    let url = format!(
        "postgres://postgres@localhost:{}/postgres?sslmode=verify-full&sslrootcert={}&passfile={}",
        server.port(),
        server.ca_file().display(),
        passfile.display()
    );
    let store = connect(&url).await.unwrap();
    assert!(
        store
            .get(&scope(), &IdempotencyKey::new("none").unwrap())
            .await
            .unwrap()
            .is_none()
    );
}
