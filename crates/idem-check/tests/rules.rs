//! Each rule of the checker on a small history written by hand.

use idem_check::{Report, ViolationKind, check, effects, history};

fn run(history: &str, effects: &str) -> Report {
    let history = history::read(history.as_bytes()).expect("a valid history");
    history::validate(&history).expect("a well-formed history");
    let effects = effects::read(effects.as_bytes()).expect("a valid effect log");
    check(&history, &effects)
}

fn kinds(report: &Report) -> Vec<ViolationKind> {
    report.violations.iter().map(|v| v.kind).collect()
}

const INVOKE_A: &str = r#"{"type":"invoke","op":1,"process":"c1","at_ms":1,"scope":"pay","key":"a","fingerprint":"f1"}"#;
const OK_A: &str =
    r#"{"type":"ok","op":1,"process":"c1","at_ms":2,"answer":{"status":201,"body_hash":"b1"}}"#;

#[test]
fn an_acknowledged_key_applied_once_is_clean() {
    let report = run(
        &format!("{INVOKE_A}\n{OK_A}\n"),
        r#"{"key":"a","scope":"pay"}"#,
    );
    assert!(report.is_clean(), "{report}");
    assert_eq!(report.counts.operations, 1);
    assert_eq!(report.counts.ok, 1);
    assert_eq!(report.counts.keys, 1);
    assert!(report.to_string().contains("no violations"));
}

#[test]
fn an_acknowledged_key_applied_twice_or_never_is_reported() {
    let history = format!("{INVOKE_A}\n{OK_A}\n");
    let twice = run(
        &history,
        "{\"key\":\"a\"}\n{\"key\":\"a\",\"scope\":\"pay\"}\n",
    );
    assert_eq!(kinds(&twice), [ViolationKind::DoubleEffect]);
    assert_eq!(twice.violations[0].keys, ["a"]);
    assert_eq!(twice.violations[0].ops, [1]);
    let never = run(&history, "");
    assert_eq!(kinds(&never), [ViolationKind::AckedNotApplied]);
}

#[test]
fn an_effect_of_another_scope_does_not_count() {
    let report = run(
        &format!("{INVOKE_A}\n{OK_A}\n"),
        r#"{"key":"a","scope":"other"}"#,
    );
    assert_eq!(kinds(&report), [ViolationKind::AckedNotApplied]);
    assert_eq!(report.counts.effects_without_operation, 1);
}

#[test]
fn unknown_allows_at_most_once_and_fail_allows_none() {
    let unknown = format!(
        "{INVOKE_A}\n{}\n",
        r#"{"type":"unknown","op":1,"process":"c1","at_ms":2,"error":"timed out"}"#
    );
    assert!(run(&unknown, "").is_clean());
    assert!(run(&unknown, r#"{"key":"a"}"#).is_clean());
    assert_eq!(
        kinds(&run(&unknown, "{\"key\":\"a\"}\n{\"key\":\"a\"}")),
        [ViolationKind::DoubleEffect]
    );

    let failed = format!(
        "{INVOKE_A}\n{}\n",
        r#"{"type":"fail","op":1,"process":"c1","at_ms":2,"error":"refused"}"#
    );
    assert!(run(&failed, "").is_clean());
    assert_eq!(
        kinds(&run(&failed, r#"{"key":"a"}"#)),
        [ViolationKind::FailedButApplied]
    );
}

#[test]
fn a_failed_attempt_retried_to_ok_is_held_to_exactly_once() {
    let history = format!(
        "{INVOKE_A}\n{}\n{INVOKE_A}\n{OK_A}\n",
        r#"{"type":"fail","op":1,"process":"c1","at_ms":2,"error":"503"}"#
    );
    let report = run(&history, r#"{"key":"a"}"#);
    assert!(report.is_clean(), "{report}");
    assert_eq!(report.counts.retries, 1);
    // A refused duplicate of an acknowledged key: the key is acknowledged.
    let dup = format!(
        "{INVOKE_A}\n{OK_A}\n{}\n{}\n",
        r#"{"type":"invoke","op":2,"process":"proxy","at_ms":3,"scope":"pay","key":"a","fingerprint":"f1","duplicate_of":1}"#,
        r#"{"type":"fail","op":2,"process":"proxy","at_ms":4,"error":"409 in flight"}"#
    );
    let report = run(&dup, r#"{"key":"a"}"#);
    assert!(report.is_clean(), "{report}");
    assert_eq!(report.counts.duplicates_sent, 1);
}

#[test]
fn a_replay_must_equal_the_original() {
    let replay = |status: u16, body: &str| {
        format!(
            r#"{{"type":"invoke","op":2,"process":"c2","at_ms":3,"scope":"pay","key":"a","fingerprint":"f1"}}
{{"type":"ok","op":2,"process":"c2","at_ms":4,"answer":{{"status":{status},"body_hash":"{body}","replayed":true}}}}"#
        )
    };
    let same = run(
        &format!("{INVOKE_A}\n{OK_A}\n{}\n", replay(201, "b1")),
        r#"{"key":"a"}"#,
    );
    assert!(same.is_clean(), "{same}");
    assert_eq!(same.counts.replays_seen, 1);
    let differs = run(
        &format!("{INVOKE_A}\n{OK_A}\n{}\n", replay(200, "b2")),
        r#"{"key":"a"}"#,
    );
    assert_eq!(kinds(&differs), [ViolationKind::ReplayDiffers]);
    assert_eq!(differs.violations[0].ops, [1, 2]);
}

#[test]
fn one_key_applied_for_two_payloads_is_key_reuse() {
    let history = format!(
        "{INVOKE_A}\n{OK_A}\n{}\n{}\n",
        r#"{"type":"invoke","op":2,"process":"c2","at_ms":3,"scope":"pay","key":"a","fingerprint":"f2"}"#,
        r#"{"type":"ok","op":2,"process":"c2","at_ms":4,"answer":{"status":201,"body_hash":"b2"}}"#
    );
    let report = run(&history, "{\"key\":\"a\"}\n{\"key\":\"a\"}\n");
    assert_eq!(kinds(&report), [ViolationKind::KeyReuse]);
    assert_eq!(report.violations[0].ops, [1, 2]);
}

#[test]
fn a_retry_under_a_new_key_that_applies_again_is_reported() {
    let history = format!(
        "{INVOKE_A}\n{}\n{}\n{}\n",
        r#"{"type":"unknown","op":1,"process":"c1","at_ms":2,"error":"timed out"}"#,
        r#"{"type":"invoke","op":1,"process":"c1","at_ms":3,"scope":"pay","key":"a-retry","fingerprint":"f1"}"#,
        r#"{"type":"ok","op":1,"process":"c1","at_ms":4,"answer":{"status":201}}"#
    );
    let report = run(&history, "{\"key\":\"a\"}\n{\"key\":\"a-retry\"}\n");
    assert_eq!(kinds(&report), [ViolationKind::NewKeyOnRetry]);
    assert_eq!(report.violations[0].keys, ["a", "a-retry"]);
    assert!(run(&history, "{\"key\":\"a-retry\"}\n").is_clean());
}

#[test]
fn a_lower_fence_after_a_higher_one_is_a_stale_write() {
    let effects = r#"{"key":"w1","resource":"r","fence":1}
{"key":"w2","resource":"r","fence":2}
{"key":"w3","resource":"r","fence":2}
{"key":"x1","resource":"other","fence":1}
{"key":"w4","resource":"r","fence":1}
"#;
    let report = run("", effects);
    assert_eq!(kinds(&report), [ViolationKind::StaleWrite]);
    assert_eq!(report.violations[0].keys, ["w2", "w4"]);
    assert_eq!(report.violations[0].resource.as_deref(), Some("r"));
}

#[test]
fn operations_without_a_key_are_counted_apart() {
    let history = r#"{"type":"invoke","op":1,"process":"c1","at_ms":1,"key":null}
{"type":"ok","op":1,"process":"c1","at_ms":2,"answer":{"status":200}}
{"type":"invoke","op":2,"process":"c1","at_ms":3,"key":"b"}
"#;
    let report = run(history, "");
    assert!(report.is_clean(), "{report}");
    assert_eq!(report.counts.without_key, 1);
    assert_eq!(report.counts.unanswered, 1);
    assert_eq!(report.counts.unknown, 1);
}

#[test]
fn the_report_lists_the_first_keys_and_counts_the_rest() {
    let mut history = String::new();
    for op in 1..=13 {
        history.push_str(&format!(
            "{{\"type\":\"invoke\",\"op\":{op},\"process\":\"c\",\"at_ms\":1,\"key\":\"k{op}\"}}\n{{\"type\":\"ok\",\"op\":{op},\"process\":\"c\",\"at_ms\":2,\"answer\":{{\"status\":200}}}}\n"
        ));
    }
    let report = run(&history, "");
    assert_eq!(report.violations.len(), 13);
    let text = report.to_string();
    assert!(text.contains("acknowledged, never applied (13)"), "{text}");
    assert!(
        text.contains("\"k1\": answered ok but never applied (ops 1)"),
        "{text}"
    );
    assert!(text.contains("and 3 more"), "{text}");
    let json = serde_json::to_value(&report).unwrap();
    assert_eq!(json["counts"]["operations"], 13);
    assert_eq!(json["violations"][0]["kind"], "acked_not_applied");
}

#[test]
fn an_answer_without_an_invoke_is_refused() {
    let events = history::read(
        r#"{"type":"ok","op":4,"process":"c","at_ms":2,"answer":{"status":200}}"#.as_bytes(),
    )
    .unwrap();
    let error = history::validate(&events).unwrap_err().to_string();
    assert!(error.contains("op 4"), "{error}");
}
