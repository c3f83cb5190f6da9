//! The exhaustive checks: the protocol as the stores run it holds every
//! property for three workers on one key, reaches the paths it is meant to
//! reach, and a store with a planted bug is caught with a counterexample.

use idem_model::model::{
    COMPLETES, ENDED_TAKEN_OVER, LOST, REPEATED, RESOURCE_FENCES, RESOURCE_MATCHES, SECOND_WINDOW,
    SETTLED_TWICE, STALE_NEVER_COMPLETES, STORE_FENCES, TAKEOVER,
};
use idem_model::{Action, Bug, Config, Order, Report, check, first_counterexample};

fn run(label: &str, config: Config) -> Report {
    show(label, check(config))
}

fn show(label: &str, report: Report) -> Report {
    println!(
        "{label}: {} distinct states ({} generated, depth {}) in {:.1?}",
        report.unique_states, report.states, report.max_depth, report.elapsed
    );
    for (property, steps) in &report.counterexamples {
        println!("  counterexample to {property:?}: {steps:?}");
    }
    report
}

#[test]
fn effect_first_holds_every_property_and_reaches_takeovers_and_fencing() {
    let report = run("apply_leased, 3 workers", Config::default());
    assert!(report.counterexamples.is_empty(), "{report:#?}");
    for path in [
        TAKEOVER,
        ENDED_TAKEN_OVER,
        STORE_FENCES,
        RESOURCE_FENCES,
        COMPLETES,
        REPEATED,
    ] {
        assert!(report.reached(path), "never reached {path:?}: {report:#?}");
    }
    // Inside one window: no second claim, and a completion always wrote.
    assert!(!report.reached(SECOND_WINDOW) && !report.reached(SETTLED_TWICE));
    assert!(!report.reached(LOST));
}

#[test]
fn record_first_writes_the_effect_at_most_once() {
    let report = run(
        "apply_at_most_once, 3 workers",
        Config::default().with_order(Order::RecordFirst),
    );
    assert!(report.counterexamples.is_empty(), "{report:#?}");
    for path in [TAKEOVER, ENDED_TAKEN_OVER, STORE_FENCES, COMPLETES, LOST] {
        assert!(report.reached(path), "never reached {path:?}: {report:#?}");
    }
    // Nobody writes but the worker that recorded the key.
    assert!(!report.reached(REPEATED) && !report.reached(RESOURCE_FENCES));
    assert!(!report.reached(SECOND_WINDOW));
}

#[test]
fn a_complete_that_ignores_the_token_is_caught() {
    // The shortest counterexample: a worker stalls past its lease, another
    // takes over, and the stalled one completes.
    let bug = Config::default().with_bug(Bug::CompleteIgnoresToken);
    let report = show("complete ignores the token", first_counterexample(bug));
    let steps = report.counterexample(STALE_NEVER_COMPLETES).unwrap();
    assert!(
        matches!(steps.last(), Some(Action::Complete(_))),
        "{steps:?}"
    );
    assert!(report.counterexample(RESOURCE_MATCHES).is_some());
}

#[test]
fn a_takeover_that_reuses_the_token_is_caught() {
    let bug = Config::default().with_bug(Bug::TakeoverReusesToken);
    let report = show("a takeover reuses the token", first_counterexample(bug));
    let steps = report.counterexample(STALE_NEVER_COMPLETES).unwrap();
    assert!(
        matches!(steps.last(), Some(Action::Complete(_))),
        "{steps:?}"
    );
}

/// A window of three ticks inside a run of five (four claims at most, to
/// keep the larger state space quick).
fn short_window() -> Config {
    Config {
        horizon: 5,
        max_claims: 4,
        ..Config::default()
    }
    .with_retention(3)
}

#[test]
fn past_the_window_the_key_runs_again_and_tokens_still_grow() {
    // No sweeper: expired records are replaced by the next claim, with the
    // next token.
    let report = run(
        "a window of 3 ticks, no sweeper",
        short_window().with_sweeps(false),
    );
    assert!(report.counterexamples.is_empty(), "{report:#?}");
    assert!(report.reached(SECOND_WINDOW) && report.reached(SETTLED_TWICE));
}

#[test]
fn a_sweep_does_not_count_the_tokens_again() {
    // The same window with a sweeper: the record is deleted past retention,
    // and the next claim's token is the new window's first, above every
    // token of the old one. A worker that held a claim across the end of the
    // window (a lease taken over just before it ended) stays fenced.
    let report = run("a window of 3 ticks, swept", short_window());
    assert!(report.counterexamples.is_empty(), "{report:#?}");
    assert!(report.reached(SETTLED_TWICE) && report.reached(STORE_FENCES));
    let record_first = run(
        "a window of 3 ticks, swept, record first",
        short_window().with_order(Order::RecordFirst),
    );
    assert!(record_first.counterexamples.is_empty(), "{record_first:#?}");
}
