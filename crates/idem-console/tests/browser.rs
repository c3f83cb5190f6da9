//! The console in a real browser: headless Chromium, driven through
//! chromedriver (Debian's `chromium` and `chromium-driver`), against a real
//! store (SQLite, PostgreSQL, Redis, DynamoDB). Finds a record by key and
//! opens it, sees a dead letter and redrives it (a real consumer applies it
//! once), evicts a key and sees the audit line, sees the pages a store cannot
//! serve say so (Redis and DynamoDB keep no outbox and cannot be audited),
//! and checks that a read-only sign-in shows no action button.
//! Each page's screenshot is kept in `target/console-screenshots/STORE/`.

mod common;

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use common::{Consumer, Kind, Served, TestStore, token};
use fantoccini::{Client, ClientBuilder, Locator};
use idem::{DeadLetterStore, IdempotencyKey, RecordStore, Scope};
use idem_console::Access;
use tokio::process::{Child, Command};

/// chromedriver on a port of its own, killed when dropped.
struct Driver {
    child: Child,
    port: u16,
}

fn find(names: &[&str]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .flat_map(|dir| names.iter().map(move |name| dir.join(name)))
        .chain(["/usr/lib/chromium/chromedriver".into()])
        .find(|candidate| candidate.is_file())
}

impl Driver {
    /// Starts chromedriver; `None` (after saying so) when it is not
    /// installed and services are not required.
    async fn start() -> Option<Self> {
        let Some(binary) = find(&["chromedriver"]) else {
            idem_testkit::services::missing_service(
                "chromedriver",
                "not installed: scripts/test.sh installs Debian's chromium and chromium-driver",
            );
            return None;
        };
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new(binary)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("start chromedriver");
        for _ in 0..100 {
            if tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_ok()
            {
                return Some(Self { child, port });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("chromedriver did not answer on port {port} within 10 s");
    }

    async fn browser(&self) -> Client {
        let mut capabilities = serde_json::Map::new();
        let mut options = serde_json::json!({ "args": [
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--window-size=1280,900",
        ] });
        if let Some(binary) = find(&["chromium", "chromium-browser"]) {
            options["binary"] = binary.display().to_string().into();
        }
        capabilities.insert("goog:chromeOptions".into(), options);
        ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
            .capabilities(capabilities)
            .connect(&format!("http://127.0.0.1:{}", self.port))
            .await
            .expect("a Chromium session from chromedriver")
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}

/// Where the screenshots of `store` go.
fn shots(store: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../target/console-screenshots")
        .join(store);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

async fn shot(browser: &Client, dir: &std::path::Path, name: &str) {
    let png = browser.screenshot().await.unwrap();
    assert!(png.starts_with(b"\x89PNG"), "a PNG screenshot");
    std::fs::write(dir.join(format!("{name}.png")), png).unwrap();
}

/// Clicks what `locator` finds, then waits until the page that click
/// opens has replaced this one and loaded.
async fn click_to(browser: &Client, locator: Locator<'_>) {
    let old = browser.find(Locator::Css("html")).await.unwrap();
    browser
        .find(locator)
        .await
        .unwrap_or_else(|e| panic!("nothing to click: {e}"))
        .click()
        .await
        .unwrap();
    for _ in 0..200 {
        let replaced = old.attr("lang").await.is_err();
        let ready = browser
            .execute("return document.readyState", vec![])
            .await
            .is_ok_and(|state| state == "complete");
        if replaced && ready {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the click did not lead to a new page within 10 s");
}

async fn text(browser: &Client, css: &str) -> String {
    browser
        .find(Locator::Css(css))
        .await
        .unwrap_or_else(|e| panic!("no {css} on the page: {e}"))
        .text()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_in_a_browser() {
    if let Some(store) = TestStore::fresh(Kind::Sqlite).await {
        operator_walk(store, "sqlite").await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_in_a_browser() {
    if let Some(store) = TestStore::fresh(Kind::Postgres).await {
        operator_walk(store, "postgres").await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_in_a_browser() {
    if let Some(store) = TestStore::fresh(Kind::Redis).await {
        operator_walk(store, "redis").await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dynamodb_in_a_browser() {
    if let Some(store) = TestStore::fresh(Kind::DynamoDb).await {
        operator_walk(store, "dynamodb").await;
    }
}

async fn operator_walk(t: TestStore, name: &str) {
    let Some(driver) = Driver::start().await else {
        return;
    };
    let consumer = Consumer::start().await;
    for i in 1..=6 {
        t.record(
            "POST:/v1/payments",
            &format!("pay-{i:03}"),
            Some(&format!(
                "{{\"id\":\"pay-{i:03}\",\"status\":\"captured\",\"amount\":{}}}",
                i * 1200
            )),
        )
        .await;
        t.clock.advance(Duration::from_secs(7));
    }
    let to = consumer.destination();
    let letter = t
        .dead_letter(
            "refund-17",
            &to,
            "upstream refused: 503 Service Unavailable\nretry-after: 30",
        )
        .await;
    t.dead_letter(
        "refund-18",
        &to,
        "upstream refused: 503 Service Unavailable\nretry-after: 12",
    )
    .await;
    t.dead_letter("refund-19", &to, "payload invalid: currency missing")
        .await;
    t.clock.advance(Duration::from_secs(90));
    // One claim whose 60 s lease ended, one whose lease runs 40 s more.
    t.record("POST:/v1/payments", "pay-stuck", None).await;
    t.clock.advance(Duration::from_secs(45));
    t.record("POST:/v1/payments", "pay-running", None).await;
    t.clock.advance(Duration::from_secs(20));

    let served = Served::start(&t.store, Access::open()).await;
    let dir = shots(name);
    let browser = driver.browser().await;

    // A few samples for the charts.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    browser.goto(&served.url("/")).await.unwrap();
    shot(&browser, &dir, "overview").await;

    // Find a record by key, and open it.
    browser.goto(&served.url("/records")).await.unwrap();
    browser
        .find(Locator::Id("key_prefix"))
        .await
        .unwrap()
        .send_keys("pay-00")
        .await
        .unwrap();
    click_to(&browser, Locator::Css("form.filters button")).await;
    let listed = browser
        .find_all(Locator::Css("table.records tbody tr"))
        .await
        .unwrap();
    assert_eq!(listed.len(), 6, "the six pay-00x records");
    shot(&browser, &dir, "records").await;
    click_to(&browser, Locator::LinkText("pay-004")).await;
    assert!(text(&browser, "#body").await.contains("\"amount\":4800"));
    shot(&browser, &dir, "record").await;

    browser.goto(&served.url("/in-flight")).await.unwrap();
    let expired = text(&browser, "body").await;
    assert!(expired.contains("pay-stuck") && expired.contains("awaiting a takeover"));
    let leases = browser
        .find_all(Locator::Css("[data-lease-left-ms]"))
        .await
        .unwrap();
    assert!(
        leases[0].text().await.unwrap().ends_with("s left"),
        "pay-running counts down"
    );
    assert!(
        leases[1].text().await.unwrap().starts_with("ended"),
        "pay-stuck ended"
    );
    shot(&browser, &dir, "in-flight").await;

    // See a dead letter, redrive it, and see the consumer apply it once.
    browser.goto(&served.url("/dead-letters")).await.unwrap();
    assert!(
        text(&browser, "table.groups")
            .await
            .contains("upstream refused: 503 Service Unavailable")
    );
    shot(&browser, &dir, "dead-letters").await;
    let letter_link = letter.to_string();
    click_to(&browser, Locator::LinkText(&letter_link)).await;
    assert!(text(&browser, "#payload").await.contains("refund-17"));
    shot(&browser, &dir, "dead-letter").await;
    click_to(&browser, Locator::Id("redrive")).await;
    assert!(
        text(&browser, "#consequence")
            .await
            .contains("original idempotency key")
    );
    shot(&browser, &dir, "redrive-confirm").await;
    click_to(&browser, Locator::Id("confirm")).await;
    assert_eq!(text(&browser, "#redriven").await, "1 redriven, 0 failed.");
    assert_eq!(consumer.counts(), (1, 1), "delivered and applied once");
    assert!(
        t.store
            .get_dead_letter(letter)
            .await
            .unwrap()
            .unwrap()
            .redriven_at
            .is_some()
    );

    // Evict a key, and see the audit line.
    browser
        .goto(&served.url("/records/show?scope=POST:/v1/payments&key=pay-002"))
        .await
        .unwrap();
    click_to(&browser, Locator::Id("evict")).await;
    browser
        .find(Locator::Id("actor"))
        .await
        .unwrap()
        .send_keys("alice")
        .await
        .unwrap();
    shot(&browser, &dir, "evict-confirm").await;
    click_to(&browser, Locator::Id("confirm")).await;
    assert!(text(&browser, ".notice").await.contains("Audit entry"));
    let scope = Scope::new("POST:/v1/payments").unwrap();
    let key = IdempotencyKey::new("pay-002").unwrap();
    assert!(
        t.store.get(&scope, &key).await.unwrap().is_none(),
        "evicted"
    );
    browser.goto(&served.url("/audit")).await.unwrap();
    let line = text(&browser, "table.audit tbody tr").await;
    assert!(
        line.contains("alice") && line.contains("evict") && line.contains("pay-002"),
        "{line}"
    );
    shot(&browser, &dir, "audit").await;

    browser.goto(&served.url("/outbox")).await.unwrap();
    if !t.store.offers_atomic_mode() {
        assert!(
            text(&browser, "#no-outbox")
                .await
                .contains("not available on this store")
        );
    } else {
        assert!(text(&browser, "main").await.contains("Recent sends"));
    }
    shot(&browser, &dir, "outbox").await;

    browser.goto(&served.url("/auditor")).await.unwrap();
    if !t.store.offers_atomic_mode() {
        assert!(
            text(&browser, "#not-available")
                .await
                .contains("not available on this store")
        );
    } else {
        assert!(
            text(&browser, "#not-configured")
                .await
                .contains("No auditor runs")
        );
    }
    shot(&browser, &dir, "auditor").await;
    browser.close().await.unwrap();

    // A read-only sign-in: the same record page, without the button.
    let guarded = Served::start(
        &t.store,
        Access::with_tokens(Some(token("operator-secret")), Some(token("viewer-secret"))),
    )
    .await;
    let browser = driver.browser().await;
    browser.goto(&guarded.url("/records")).await.unwrap();
    assert_eq!(browser.current_url().await.unwrap().path(), "/login");
    browser
        .find(Locator::Id("token"))
        .await
        .unwrap()
        .send_keys("viewer-secret")
        .await
        .unwrap();
    shot(&browser, &dir, "login").await;
    click_to(&browser, Locator::Css("main form button")).await;
    browser
        .goto(&guarded.url("/records/show?scope=POST:/v1/payments&key=pay-003"))
        .await
        .unwrap();
    assert!(text(&browser, "header").await.contains("read-only"));
    assert!(
        browser.find(Locator::Id("evict")).await.is_err(),
        "no action button"
    );
    browser.close().await.unwrap();
}
