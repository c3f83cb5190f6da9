//! The console's API and pages over HTTP, against real SQLite and PostgreSQL
//! stores: listing and paging, a record in full, eviction with its audit
//! line, dead letters grouped and redriven (applied once by a real
//! consumer), and who may do what (tokens, the read-only token, CSRF).

#[macro_use]
mod common;

use std::time::Duration;

use axum::http::{Method, StatusCode};
use common::{Client, Consumer, Served, TestStore, token};
use idem::{DeadLetterStore, IdempotencyKey, OutboxMessage, OutboxStore, RecordStore, Scope};
use idem_console::Access;
use serde_json::json;

on_every_store!(
    records_are_filtered_paged_and_shown,
    in_flight_claims_are_split_by_their_lease,
    an_eviction_is_logged_and_a_changed_record_is_refused,
    dead_letters_are_grouped_and_a_redrive_is_applied_once,
    a_read_only_token_reads_but_cannot_act,
    forms_need_the_csrf_token_and_the_same_origin,
    letters_are_discarded_and_archived_with_an_audit_line,
    a_read_only_token_cannot_set_letters_aside,
    the_outbox_shows_its_recent_sends_newest_first,
);

async fn records_are_filtered_paged_and_shown(t: TestStore) {
    for i in 0..7 {
        t.record(
            "payments",
            &format!("pay-{i}"),
            Some(&format!("{{\"paid\":{i}}}")),
        )
        .await;
        t.clock.advance(Duration::from_millis(10));
    }
    t.record("refunds", "ref-1", Some("ok")).await;
    t.record("payments", "pay-open", None).await;
    let served = Served::start(&t.store, Access::open()).await;
    let client = Client::new();

    let page = client
        .get(&served.url("/api/v1/records?key_prefix=pay-&limit=3"), &[])
        .await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    let mut seen = Vec::new();
    let mut json = page.json();
    loop {
        for record in json["records"].as_array().unwrap() {
            seen.push(record["key"].as_str().unwrap().to_owned());
        }
        let Some(next) = json["next"].as_object() else {
            break;
        };
        let url = format!(
            "/api/v1/records?key_prefix=pay-&limit=3&after_created_ms={}&after_scope={}&after_key={}",
            next["after_created_ms"],
            next["after_scope"].as_str().unwrap(),
            next["after_key"].as_str().unwrap()
        );
        json = client.get(&served.url(&url), &[]).await.json();
    }
    assert_eq!(seen.len(), 8, "every pay- record once: {seen:?}");
    assert_eq!(seen[0], "pay-open", "newest first");
    assert_eq!(seen[7], "pay-0");

    let completed = client
        .get(&served.url("/api/v1/records?state=in_flight"), &[])
        .await
        .json();
    let keys: Vec<&str> = completed["records"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["key"].as_str().unwrap())
        .collect();
    assert_eq!(keys, ["pay-open"]);
    let refunds = client
        .get(&served.url("/api/v1/records?scope=refunds"), &[])
        .await
        .json();
    assert_eq!(refunds["records"].as_array().unwrap().len(), 1);

    let one = client
        .get(
            &served.url("/api/v1/records/one?scope=payments&key=pay-3"),
            &[],
        )
        .await;
    let one = one.json();
    assert_eq!(one["state"], "completed");
    assert!(one["token"].as_i64().unwrap() > 0);
    assert_eq!(one["outcome"]["body"], "{\"paid\":3}");
    assert_eq!(one["lease"], "none");
    assert_eq!(one["fingerprint"].as_str().unwrap().len(), 64);

    let page = client
        .get(&served.url("/records/show?scope=payments&key=pay-3"), &[])
        .await;
    assert_eq!(page.status, StatusCode::OK);
    assert!(page.body.contains("{&quot;paid&quot;:3}"), "{}", page.body);
    assert!(page.body.contains("evict this key"));

    client
        .get(
            &served.url("/api/v1/records/one?scope=payments&key=nope"),
            &[],
        )
        .await
        .problem(StatusCode::NOT_FOUND);
    let detail = client
        .get(&served.url("/api/v1/records?state=stuck"), &[])
        .await
        .problem(StatusCode::BAD_REQUEST);
    assert!(
        detail.contains("in_flight, completed or failed"),
        "{detail}"
    );
    client
        .get(&served.url("/api/v1/records?after_key=x"), &[])
        .await
        .problem(StatusCode::BAD_REQUEST);
    client
        .get(&served.url("/api/v1/records?limit=-1"), &[])
        .await
        .problem(StatusCode::BAD_REQUEST);
    client
        .get(&served.url("/api/v1/no-such-thing"), &[])
        .await
        .problem(StatusCode::NOT_FOUND);
    client
        .send(Method::DELETE, &served.url("/api/v1/records"), &[], "")
        .await
        .problem(StatusCode::METHOD_NOT_ALLOWED);
    let doc = client
        .get(&served.url("/api/v1/openapi.json"), &[])
        .await
        .json();
    assert!(doc["paths"]["/api/v1/records"]["get"].is_object());
    assert!(doc["components"]["schemas"]["Problem"].is_object());
}

async fn in_flight_claims_are_split_by_their_lease(t: TestStore) {
    t.record("payments", "stuck", None).await;
    t.clock.advance(Duration::from_secs(30));
    t.record("payments", "running", None).await;
    // The first claim's 60 s lease ends; the second's runs 30 s more.
    t.clock.advance(Duration::from_secs(31));
    let served = Served::start(&t.store, Access::open()).await;
    let client = Client::new();
    let claims = client
        .get(&served.url("/api/v1/in-flight"), &[])
        .await
        .json();
    assert_eq!(claims["alive"][0]["key"], "running");
    assert_eq!(claims["alive"][0]["lease_remaining_ms"], 29_000);
    assert_eq!(claims["expired"][0]["key"], "stuck");
    assert_eq!(claims["expired"][0]["lease"], "expired");
    let page = client.get(&served.url("/in-flight"), &[]).await;
    assert!(page.body.contains("awaiting a takeover"));
    assert!(page.body.contains("data-lease-left-ms=\"29000\""));
    let overview = client
        .get(&served.url("/api/v1/overview"), &[])
        .await
        .json();
    assert_eq!(
        (
            overview["in_flight_alive"].as_u64(),
            overview["in_flight_expired"].as_u64()
        ),
        (Some(1), Some(1))
    );
}

async fn an_eviction_is_logged_and_a_changed_record_is_refused(t: TestStore) {
    t.record("payments", "pay-1", Some("paid")).await;
    let served = Served::start(&t.store, Access::open()).await;
    let client = Client::new();
    let shown = client
        .get(
            &served.url("/api/v1/records/one?scope=payments&key=pay-1"),
            &[],
        )
        .await
        .json();
    let token = shown["token"].as_i64().unwrap();
    let change = |token: i64, actor: &str| {
        json!({
            "scope": "payments", "key": "pay-1",
            "token": token, "updated_at_ms": shown["updated_at_ms"], "actor": actor,
        })
    };
    let stale = client
        .post_json(
            &served.url("/api/v1/records/evict"),
            &[],
            &change(token + 1, "alice"),
        )
        .await
        .problem(StatusCode::CONFLICT);
    assert!(stale.contains("changed since it was shown"), "{stale}");
    client
        .post_json(
            &served.url("/api/v1/records/evict"),
            &[],
            &change(token, " "),
        )
        .await
        .problem(StatusCode::BAD_REQUEST);
    let released = client
        .post_json(
            &served.url("/api/v1/records/release"),
            &[],
            &change(token, "alice"),
        )
        .await
        .problem(StatusCode::CONFLICT);
    assert!(released.contains("not in flight"), "{released}");
    let scope = Scope::new("payments").unwrap();
    let key = IdempotencyKey::new("pay-1").unwrap();
    assert!(
        t.store.get(&scope, &key).await.unwrap().is_some(),
        "refusals change nothing"
    );

    let done = client
        .post_json(
            &served.url("/api/v1/records/evict"),
            &[],
            &change(token, "alice"),
        )
        .await;
    assert_eq!(done.status, StatusCode::OK, "{}", done.body);
    let audit = done.json()["audit"].clone();
    assert_eq!(audit["action"], "evict");
    assert_eq!(audit["key"], "pay-1");
    assert!(
        audit["actor"]
            .as_str()
            .unwrap()
            .starts_with("alice (console, from 127.0.0.1)")
    );
    let before: serde_json::Value =
        serde_json::from_str(audit["before"].as_str().unwrap()).unwrap();
    assert_eq!(before["state"], "completed");
    assert!(
        t.store.get(&scope, &key).await.unwrap().is_none(),
        "evicted"
    );
    let log = client.get(&served.url("/api/v1/audit"), &[]).await.json();
    assert_eq!(log.as_array().unwrap().len(), 1);
    assert_eq!(log[0]["id"], audit["id"]);
    client
        .post_json(
            &served.url("/api/v1/records/evict"),
            &[],
            &change(token, "alice"),
        )
        .await
        .problem(StatusCode::NOT_FOUND);
}

async fn dead_letters_are_grouped_and_a_redrive_is_applied_once(t: TestStore) {
    let consumer = Consumer::start().await;
    let to = consumer.destination();
    let first = t
        .dead_letter(
            "pay-a",
            &to,
            "upstream refused: 503 Service Unavailable\nretry-after: 5",
        )
        .await;
    t.dead_letter(
        "pay-b",
        &to,
        "upstream refused: 503 Service Unavailable\nretry-after: 9",
    )
    .await;
    t.clock.advance(Duration::from_secs(120));
    t.dead_letter("pay-c", &to, "payload invalid: amount missing")
        .await;
    let served = Served::start(&t.store, Access::open()).await;
    let client = Client::new();

    let groups = client
        .get(&served.url("/api/v1/dead-letters/groups"), &[])
        .await
        .json();
    assert_eq!(
        groups[0]["cause"],
        "upstream refused: 503 Service Unavailable"
    );
    assert_eq!(groups[0]["letters"], 2);
    assert_eq!(groups[1]["letters"], 1);
    let old = client
        .get(&served.url("/api/v1/dead-letters?min_age_s=60"), &[])
        .await
        .json();
    assert_eq!(old["total"], 2);
    let invalid = client
        .get(&served.url("/api/v1/dead-letters?error=AMOUNT"), &[])
        .await
        .json();
    assert_eq!(invalid["letters"][0]["key"], "pay-c");
    let letter = client
        .get(&served.url(&format!("/api/v1/dead-letters/{first}")), &[])
        .await
        .json();
    assert_eq!(letter["headers"]["authorization"], "<redacted>");
    assert_eq!(letter["cause"], "upstream refused: 503 Service Unavailable");

    let plan = client
        .get(
            &served.url("/api/v1/dead-letters/redrive-plan?cause=upstream%20refused:%20503%20Service%20Unavailable"),
            &[],
        )
        .await
        .json();
    assert_eq!(plan["letters"], 2);
    assert_eq!(plan["destinations"][0], to);
    let report = client
        .post_json(
            &served.url("/api/v1/dead-letters/redrive"),
            &[],
            &json!({ "ids": plan["ids"] }),
        )
        .await;
    assert_eq!(report.status, StatusCode::OK, "{}", report.body);
    assert_eq!(report.json()["redriven"].as_array().unwrap().len(), 2);
    assert_eq!(consumer.counts(), (2, 2));
    assert_eq!(t.store.dead_letter_stats().await.unwrap().waiting, 1);

    // The same letter again, on purpose: delivered, not applied twice.
    let again = client
        .post_json(
            &served.url(&format!("/api/v1/dead-letters/{first}/redrive")),
            &[],
            &json!({}),
        )
        .await;
    assert_eq!(again.json()["redriven"][0], first);
    assert_eq!(consumer.counts(), (3, 2));
    client
        .post_json(
            &served.url("/api/v1/dead-letters/999999/redrive"),
            &[],
            &json!({}),
        )
        .await
        .problem(StatusCode::NOT_FOUND);

    let page = client.get(&served.url("/dead-letters"), &[]).await;
    assert!(page.body.contains("payload invalid: amount missing"));
    assert!(page.body.contains("redrive these 1 waiting letters"));
}

async fn a_read_only_token_reads_but_cannot_act(t: TestStore) {
    t.record("payments", "pay-1", Some("paid")).await;
    let access = Access::with_tokens(Some(token("op-token")), Some(token("ro-token")));
    let served = Served::start(&t.store, access).await;
    let client = Client::new();
    let viewer = [("authorization", "Bearer ro-token")];
    let operator = [("authorization", "Bearer op-token")];

    client
        .get(&served.url("/api/v1/records"), &[])
        .await
        .problem(StatusCode::UNAUTHORIZED);
    client
        .get(
            &served.url("/api/v1/records"),
            &[("authorization", "Bearer wrong")],
        )
        .await
        .problem(StatusCode::UNAUTHORIZED);
    let redirected = client.get(&served.url("/records"), &[]).await;
    assert_eq!(redirected.status, StatusCode::SEE_OTHER);

    let shown = client
        .get(
            &served.url("/api/v1/records/one?scope=payments&key=pay-1"),
            &viewer,
        )
        .await;
    assert_eq!(shown.status, StatusCode::OK);
    let shown = shown.json();
    let change = json!({
        "scope": "payments", "key": "pay-1", "token": shown["token"],
        "updated_at_ms": shown["updated_at_ms"], "actor": "mallory",
    });
    client
        .post_json(&served.url("/api/v1/records/evict"), &viewer, &change)
        .await
        .problem(StatusCode::FORBIDDEN);
    client
        .post_json(&served.url("/api/v1/records/evict"), &[], &change)
        .await
        .problem(StatusCode::UNAUTHORIZED);
    let page = client
        .get(
            &served.url("/records/show?scope=payments&key=pay-1"),
            &viewer,
        )
        .await;
    assert_eq!(page.status, StatusCode::OK);
    assert!(page.body.contains("read-only"));
    assert!(!page.body.contains("evict this key"), "no action buttons");
    let scope = Scope::new("payments").unwrap();
    let key = IdempotencyKey::new("pay-1").unwrap();
    assert!(t.store.get(&scope, &key).await.unwrap().is_some());

    // A browser signs in with the operator token and acts with its cookie.
    let form = client.get(&served.url("/login"), &[]).await;
    let csrf = form.cookie("idem_console_csrf").unwrap();
    let signed = client
        .post_form(
            &served.url("/login"),
            &[("cookie", &format!("idem_console_csrf={csrf}"))],
            &[("token", "op-token"), ("next", "/records"), ("csrf", &csrf)],
        )
        .await;
    assert_eq!(signed.status, StatusCode::SEE_OTHER);
    let session = signed.cookie("idem_console_session").unwrap();
    let cookie = format!("idem_console_session={session}");
    let page = client
        .get(
            &served.url("/records/show?scope=payments&key=pay-1"),
            &[("cookie", &cookie)],
        )
        .await;
    assert!(page.body.contains("evict this key"));
    let done = client
        .post_json(&served.url("/api/v1/records/evict"), &operator, &change)
        .await;
    assert_eq!(done.status, StatusCode::OK, "{}", done.body);
    assert!(t.store.get(&scope, &key).await.unwrap().is_none());

    // No token set: only a loopback address is accepted.
    assert!(
        Access::open()
            .check_listen("0.0.0.0:9300".parse().unwrap())
            .is_err()
    );
    assert!(
        Access::open()
            .check_listen("127.0.0.1:9300".parse().unwrap())
            .is_ok()
    );
    assert!(
        Access::open()
            .check_listen("[::1]:9300".parse().unwrap())
            .is_ok()
    );
    let with_token = Access::with_tokens(Some(token("op-token")), None);
    assert!(
        with_token
            .check_listen("0.0.0.0:9300".parse().unwrap())
            .is_ok()
    );
}

async fn forms_need_the_csrf_token_and_the_same_origin(t: TestStore) {
    t.record("payments", "pay-1", Some("paid")).await;
    let served = Served::start(&t.store, Access::open()).await;
    let client = Client::new();
    let confirm = client
        .get(&served.url("/records/evict?scope=payments&key=pay-1"), &[])
        .await;
    assert_eq!(confirm.status, StatusCode::OK);
    assert!(
        confirm.body.contains("its effect runs again"),
        "says what will happen"
    );
    let csrf = confirm.cookie("idem_console_csrf").unwrap();
    let shown = client
        .get(
            &served.url("/api/v1/records/one?scope=payments&key=pay-1"),
            &[],
        )
        .await
        .json();
    let updated = shown["updated_at_ms"].to_string();
    let token: &'static str = Box::leak(shown["token"].to_string().into_boxed_str());
    let form = |csrf: &'static str| {
        vec![
            ("scope", "payments"),
            ("key", "pay-1"),
            ("token", token),
            ("actor", "alice"),
            ("csrf", csrf),
        ]
    };
    let cookie = format!("idem_console_csrf={csrf}");
    let mut without = form("");
    without.push(("updated_at_ms", &updated));
    let refused = client
        .post_form(
            &served.url("/records/evict"),
            &[("cookie", &cookie)],
            &without,
        )
        .await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN);
    let leaked: &'static str = Box::leak(csrf.clone().into_boxed_str());
    let mut with = form(leaked);
    with.push(("updated_at_ms", &updated));
    let foreign = client
        .post_form(
            &served.url("/records/evict"),
            &[("cookie", &cookie), ("origin", "http://evil.example")],
            &with,
        )
        .await;
    assert_eq!(foreign.status, StatusCode::FORBIDDEN);
    let api_as_form = client
        .post_form(&served.url("/api/v1/records/evict"), &[], &with)
        .await;
    api_as_form.problem(StatusCode::UNSUPPORTED_MEDIA_TYPE);
    let scope = Scope::new("payments").unwrap();
    let key = IdempotencyKey::new("pay-1").unwrap();
    assert!(
        t.store.get(&scope, &key).await.unwrap().is_some(),
        "nothing changed"
    );

    let done = client
        .post_form(
            &served.url("/records/evict"),
            &[
                ("cookie", &cookie),
                ("origin", &format!("http://{}", served.addr)),
            ],
            &with,
        )
        .await;
    assert_eq!(done.status, StatusCode::OK, "{}", done.body);
    assert!(done.body.contains("Audit entry"));
    assert!(t.store.get(&scope, &key).await.unwrap().is_none());
    let audit = client.get(&served.url("/audit"), &[]).await;
    assert!(audit.body.contains("pay-1") && audit.body.contains("alice"));
}

async fn letters_are_discarded_and_archived_with_an_audit_line(t: TestStore) {
    let to = "http://127.0.0.1:9/payments";
    let gone = t
        .dead_letter("pay-a", to, "payload invalid: amount missing")
        .await;
    let kept = t
        .dead_letter("pay-b", to, "payload invalid: amount missing")
        .await;
    let other = t.dead_letter("pay-c", to, "upstream refused: 503").await;
    let third = t.dead_letter("pay-d", to, "upstream refused: 503").await;
    let served = Served::start(&t.store, Access::open()).await;
    let client = Client::new();

    // One letter: discarded, gone from the store, one audit line.
    let confirm = client
        .get(&served.url(&format!("/dead-letters/{gone}/discard")), &[])
        .await;
    assert_eq!(confirm.status, StatusCode::OK, "{}", confirm.body);
    assert!(
        confirm.body.contains("deleted for good"),
        "says what will happen: {}",
        confirm.body
    );
    let done = client
        .post_json(
            &served.url(&format!("/api/v1/dead-letters/{gone}/discard")),
            &[],
            &json!({ "actor": "alice" }),
        )
        .await;
    assert_eq!(done.status, StatusCode::OK, "{}", done.body);
    let audit = done.json()["audit"].clone();
    assert_eq!(audit["action"], "discard");
    assert_eq!(audit["dead_letter"], gone);
    assert_eq!(audit["key"], "pay-a");
    assert!(
        audit["actor"]
            .as_str()
            .unwrap()
            .starts_with("alice (console")
    );
    let before: serde_json::Value =
        serde_json::from_str(audit["before"].as_str().unwrap()).unwrap();
    assert_eq!(before["last_error"], "payload invalid: amount missing");
    assert!(t.store.get_dead_letter(gone).await.unwrap().is_none());
    client
        .post_json(
            &served.url(&format!("/api/v1/dead-letters/{gone}/discard")),
            &[],
            &json!({ "actor": "alice" }),
        )
        .await
        .problem(StatusCode::NOT_FOUND);

    // One letter archived: kept, no longer waiting; a second archive is 409.
    let done = client
        .post_json(
            &served.url(&format!("/api/v1/dead-letters/{kept}/archive")),
            &[],
            &json!({ "actor": "bob" }),
        )
        .await;
    assert_eq!(done.status, StatusCode::OK, "{}", done.body);
    assert_eq!(done.json()["audit"]["action"], "archive");
    let letter = t.store.get_dead_letter(kept).await.unwrap().unwrap();
    assert!(letter.archived_at.is_some() && !letter.is_waiting());
    let again = client
        .post_json(
            &served.url(&format!("/api/v1/dead-letters/{kept}/archive")),
            &[],
            &json!({ "actor": "bob" }),
        )
        .await
        .problem(StatusCode::CONFLICT);
    assert!(again.contains("archived already"), "{again}");
    client
        .post_json(
            &served.url(&format!("/api/v1/dead-letters/{kept}/archive")),
            &[],
            &json!({ "actor": "" }),
        )
        .await
        .problem(StatusCode::BAD_REQUEST);

    // A group: the plan names the waiting letters of the cause; archiving
    // them logs one line each.
    let plan = client
        .get(
            &served.url("/api/v1/dead-letters/set-aside-plan?action=archive&cause=upstream%20refused:%20503"),
            &[],
        )
        .await;
    assert_eq!(plan.status, StatusCode::OK, "{}", plan.body);
    let plan = plan.json();
    assert_eq!(plan["letters"], 2);
    assert_eq!(plan["ids"], json!([other, third]));
    client
        .get(
            &served.url("/api/v1/dead-letters/set-aside-plan?action=burn"),
            &[],
        )
        .await
        .problem(StatusCode::BAD_REQUEST);
    let report = client
        .post_json(
            &served.url("/api/v1/dead-letters/archive"),
            &[],
            &json!({ "ids": [other, third, gone], "actor": "carol" }),
        )
        .await;
    assert_eq!(report.status, StatusCode::OK, "{}", report.body);
    let report = report.json();
    assert_eq!(report["done"].as_array().unwrap().len(), 2);
    assert_eq!(report["skipped"][0]["id"], gone);
    let stats = t.store.dead_letter_stats().await.unwrap();
    assert_eq!((stats.waiting, stats.archived), (0, 3));
    let log = client.get(&served.url("/api/v1/audit"), &[]).await.json();
    let actions: Vec<&str> = log
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["action"].as_str().unwrap())
        .collect();
    assert_eq!(actions, ["archive", "archive", "archive", "discard"]);

    // The set's confirmation page, then its form with the CSRF token.
    let fresh = t.dead_letter("pay-e", to, "schema mismatch").await;
    let confirm = client
        .get(
            &served.url("/dead-letters/discard?cause=schema%20mismatch"),
            &[],
        )
        .await;
    assert!(
        confirm.body.contains("1 letter will be discarded"),
        "{}",
        confirm.body
    );
    let csrf = confirm.cookie("idem_console_csrf").unwrap();
    let fresh_id = fresh.to_string();
    let done = client
        .post_form(
            &served.url("/dead-letters/discard"),
            &[("cookie", &format!("idem_console_csrf={csrf}"))],
            &[("csrf", &csrf), ("id", &fresh_id), ("actor", "dave")],
        )
        .await;
    assert_eq!(done.status, StatusCode::OK, "{}", done.body);
    assert!(done.body.contains("1 discarded"), "{}", done.body);
    assert!(t.store.get_dead_letter(fresh).await.unwrap().is_none());
    let audit = client.get(&served.url("/audit"), &[]).await;
    assert!(audit.body.contains("dave"), "{}", audit.body);
}

async fn a_read_only_token_cannot_set_letters_aside(t: TestStore) {
    let id = t
        .dead_letter("pay-a", "http://127.0.0.1:9/payments", "boom")
        .await;
    let access = Access::with_tokens(Some(token("op-token")), Some(token("ro-token")));
    let served = Served::start(&t.store, access).await;
    let client = Client::new();
    let viewer = [("authorization", "Bearer ro-token")];
    for path in [
        format!("/api/v1/dead-letters/{id}/discard"),
        format!("/api/v1/dead-letters/{id}/archive"),
    ] {
        client
            .post_json(&served.url(&path), &viewer, &json!({ "actor": "mallory" }))
            .await
            .problem(StatusCode::FORBIDDEN);
        client
            .post_json(&served.url(&path), &[], &json!({ "actor": "mallory" }))
            .await
            .problem(StatusCode::UNAUTHORIZED);
    }
    for path in [
        "/api/v1/dead-letters/discard",
        "/api/v1/dead-letters/archive",
    ] {
        client
            .post_json(
                &served.url(path),
                &viewer,
                &json!({ "ids": [id], "actor": "mallory" }),
            )
            .await
            .problem(StatusCode::FORBIDDEN);
    }
    let page = client
        .get(&served.url(&format!("/dead-letters/{id}")), &viewer)
        .await;
    assert_eq!(page.status, StatusCode::OK);
    assert!(!page.body.contains("discard…") && !page.body.contains("archive…"));
    let list = client.get(&served.url("/dead-letters"), &viewer).await;
    assert!(!list.body.contains("discard them"), "no action buttons");
    let confirm = client
        .get(&served.url(&format!("/dead-letters/{id}/discard")), &viewer)
        .await;
    assert!(confirm.body.contains("A read-only token cannot do this."));
    let letter = t.store.get_dead_letter(id).await.unwrap().unwrap();
    assert!(letter.is_waiting(), "nothing changed");
    assert!(
        client
            .get(&served.url("/api/v1/audit"), &viewer)
            .await
            .json()
            .as_array()
            .unwrap()
            .is_empty()
    );
}

async fn the_outbox_shows_its_recent_sends_newest_first(t: TestStore) {
    let message = |key: &str, destination: Option<&str>| OutboxMessage {
        destination: destination.map(str::to_owned),
        key: IdempotencyKey::new(key).unwrap(),
        payload: b"{}".to_vec(),
        headers: Default::default(),
    };
    let now = || idem::Clock::now(&t.clock);
    for i in 0..3 {
        t.store
            .enqueue_now(&message(
                &format!("msg-{i}"),
                Some("amqp://relay:s3cret@127.0.0.1:5672/%2f?exchange=payments"),
            ))
            .await
            .unwrap();
    }
    t.store
        .enqueue_now(&message("msg-default", None))
        .await
        .unwrap();
    t.store
        .enqueue_now(&message("msg-waiting", Some("http://127.0.0.1:9/x")))
        .await
        .unwrap();
    // Sent one at a time, a second apart; the last one stays pending.
    for _ in 0..4 {
        let claimed = t
            .store
            .claim_outbox("relay-1", now(), Duration::from_secs(30), 1, true)
            .await
            .unwrap();
        t.clock.advance(Duration::from_secs(1));
        t.store.mark_sent(&[claimed[0].id], now()).await.unwrap();
    }
    let served = Served::start(&t.store, Access::open()).await;
    let client = Client::new();
    let outbox = client.get(&served.url("/api/v1/outbox"), &[]).await;
    assert_eq!(outbox.status, StatusCode::OK, "{}", outbox.body);
    let outbox = outbox.json();
    assert_eq!(
        (outbox["pending"].as_u64(), outbox["sent"].as_u64()),
        (Some(1), Some(4))
    );
    let sends = outbox["recent_sends"].as_array().unwrap();
    let keys: Vec<&str> = sends.iter().map(|m| m["key"].as_str().unwrap()).collect();
    assert_eq!(
        keys,
        ["msg-default", "msg-2", "msg-1", "msg-0"],
        "newest first"
    );
    assert!(sends[0]["destination"].is_null(), "the relay's default");
    let destination = sends[1]["destination"].as_str().unwrap();
    assert!(!destination.contains("s3cret"), "{destination}");
    assert!(destination.contains("127.0.0.1:5672"), "{destination}");
    assert_eq!(sends[1]["attempts"], 1);
    assert_eq!(sends[3]["waited_ms"], 1000);
    assert!(sends[0]["sent_at_ms"].as_i64() > sends[1]["sent_at_ms"].as_i64());

    let page = client.get(&served.url("/outbox"), &[]).await;
    assert!(page.body.contains("Recent sends"), "{}", page.body);
    assert!(page.body.contains("msg-2"), "{}", page.body);
    assert!(page.body.contains("default)"), "{}", page.body);
    assert!(!page.body.contains("s3cret"));
    assert!(
        !page.body.contains("msg-waiting</td>"),
        "pending is not sent"
    );
}
