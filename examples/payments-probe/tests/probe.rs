//! The probe's contract, on the example's own routes: 404 before the
//! payment, 200 with the payment and its original status after, and a repeat
//! of the payment answered with the payment already made.

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use payments_probe::{ORIGINAL_STATUS, Payment};
use tower::ServiceExt;

async fn call(app: &axum::Router, request: Request<Body>) -> (StatusCode, Option<String>, Vec<u8>) {
    let response = app.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let original = response
        .headers()
        .get(ORIGINAL_STATUS)
        .map(|v| v.to_str().unwrap().to_owned());
    let body = response
        .into_body()
        .collect()
        .await
        .unwrap()
        .to_bytes()
        .to_vec();
    (status, original, body)
}

fn probe(key: &str) -> Request<Body> {
    Request::get(format!("/payments/by-key/{key}"))
        .body(Body::empty())
        .unwrap()
}

fn pay(key: &str) -> Request<Body> {
    Request::post("/payments")
        .header("idempotency-key", format!("\"{key}\""))
        .header("content-type", "application/json")
        .body(Body::from(r#"{"amount":250}"#))
        .unwrap()
}

#[tokio::test]
async fn the_probe_says_whether_a_key_was_applied() {
    let dir = tempfile::tempdir().unwrap();
    let app = payments_probe::app(payments_probe::open(&dir.path().join("p.db")).unwrap());

    assert_eq!(call(&app, probe("k-1")).await.0, StatusCode::NOT_FOUND);
    let (status, _, body) = call(&app, pay("k-1")).await;
    assert_eq!(status, StatusCode::CREATED);
    let made: Payment = serde_json::from_slice(&body).unwrap();

    let (status, original, probed) = call(&app, probe("k-1")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(original.as_deref(), Some("201"));
    assert_eq!(probed, body, "the probe answers what the payment answered");

    let (_, _, again) = call(&app, pay("k-1")).await;
    assert_eq!(serde_json::from_slice::<Payment>(&again).unwrap(), made);
}
