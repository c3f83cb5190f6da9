//! `idem` against a PostgreSQL that requires TLS and a password: the
//! password never appears in what the process prints, whatever fails, even
//! with every log on.

use std::process::{Command, Output};

use idem_testkit::tls_postgres::TlsPostgres;

/// The server's password.
const PASSWORD: &str = "Right-Pa55word-77";
/// The wrong one the commands are given.
const SECRET: &str = "SECRET-Wr0ng-4242";

fn idem(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(args)
        .env_remove("IDEM_STORE")
        .env_remove("PGPASSWORD")
        .env("IDEM_LOG", "trace")
        .output()
        .expect("run idem")
}

/// Runs `args` and returns what it printed, after checking that it failed
/// and that neither password appears in it.
fn fails_without_printing_a_password(args: &[&str]) -> String {
    let output = idem(args);
    let printed = format!(
        "{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(!output.status.success(), "{args:?} succeeded:\n{printed}");
    for password in [SECRET, PASSWORD] {
        assert!(
            !printed.contains(password),
            "{args:?} printed a password:\n{printed}"
        );
    }
    printed
}

#[test]
fn a_wrong_password_fails_clearly_and_is_never_printed() {
    let Some(server) = TlsPostgres::start(PASSWORD) else {
        return;
    };
    let ca = server.ca_file().display().to_string();
    let port = server.port();
    let verified = format!(
        "postgres://postgres:{SECRET}@localhost:{port}/postgres?sslmode=verify-full&sslrootcert={ca}"
    );
    for args in [
        &["keys", "--store", &verified, "ls"][..],
        &["--store", &verified, "migrate"][..],
    ] {
        let printed = fails_without_printing_a_password(args);
        assert!(printed.contains("authentication failed"), "{printed}");
        assert!(printed.contains("postgres:***@localhost"), "{printed}");
    }

    // No TLS: refused, and the error says to ask for it.
    let plain = format!("postgres://postgres:{SECRET}@127.0.0.1:{port}/postgres?sslmode=disable");
    let printed = fails_without_printing_a_password(&["--store", &plain, "migrate"]);
    assert!(printed.contains("requires TLS"), "{printed}");
    assert!(printed.contains("sslmode=require"), "{printed}");

    // A certificate from another authority: refused as not verified.
    let other = server.other_ca_file().display().to_string();
    let unverified = format!(
        "postgres://postgres:{PASSWORD}@localhost:{port}/postgres?sslmode=verify-full&sslrootcert={other}"
    );
    let printed = fails_without_printing_a_password(&["--store", &unverified, "migrate"]);
    assert!(printed.contains("did not verify"), "{printed}");

    // The right password over verified TLS works.
    let right = format!(
        "postgres://postgres:{PASSWORD}@localhost:{port}/postgres?sslmode=verify-full&sslrootcert={ca}"
    );
    let output = idem(&["--store", &right, "migrate"]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("schema up to date"), "{stdout}");
    assert!(
        !stdout.contains(PASSWORD) && !stderr.contains(PASSWORD),
        "{stdout}\n{stderr}"
    );
}
