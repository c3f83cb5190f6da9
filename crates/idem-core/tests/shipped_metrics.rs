//! The alerts and the dashboard shipped in `ops/` name only metrics the code
//! emits. A metric renamed in the code, or misspelt in a query, would leave an
//! alert that never fires and a panel that stays empty; this test fails
//! instead, naming the metric.
//!
//! The emitted names are read from the source of every crate: the first
//! argument of each `counter!`, `gauge!` and `histogram!`, a string literal
//! or a `const` holding one. The used names are the metric names in the
//! PromQL of the alert rules (and the series their unit tests feed them) and
//! of the dashboard's panels.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

const METRIC_MACROS: [&str; 3] = ["counter!(", "gauge!(", "histogram!("];

/// Suffixes Prometheus adds to a histogram's (or summary's) series.
const SERIES_SUFFIXES: [&str; 3] = ["_bucket", "_sum", "_count"];

/// PromQL words that stand where a metric name could.
const KEYWORDS: [&str; 7] = ["and", "or", "unless", "bool", "offset", "inf", "nan"];

/// Words followed by a parenthesised list of label names.
const LABEL_LISTS: [&str; 6] = [
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
];

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

#[test]
fn every_metric_the_alerts_and_the_dashboard_query_is_emitted() {
    let root = workspace();
    let emitted = emitted_metrics(&root.join("crates"));
    assert!(
        emitted.contains("duplicates_suppressed_total"),
        "the scan of the source found the protocol's counters: {emitted:?}"
    );

    let mut used = BTreeMap::<String, BTreeSet<String>>::new();
    let alerts = root.join("ops/prometheus/idem-alerts.yml");
    for expr in yaml_values(&read(&alerts), "expr") {
        note(
            &mut used,
            metric_names(&expr),
            "ops/prometheus/idem-alerts.yml",
        );
    }
    let tests = root.join("ops/prometheus/idem-alerts.test.yml");
    for series in yaml_values(&read(&tests), "series") {
        note(
            &mut used,
            metric_names(&series),
            "ops/prometheus/idem-alerts.test.yml",
        );
    }
    let dashboard: serde_json::Value =
        serde_json::from_str(&read(&root.join("ops/grafana/idem-dashboard.json")))
            .expect("the dashboard is JSON");
    let mut exprs = Vec::new();
    json_strings(&dashboard, "expr", &mut exprs);
    assert!(!exprs.is_empty(), "the dashboard has queries");
    for expr in exprs {
        note(
            &mut used,
            metric_names(&expr),
            "ops/grafana/idem-dashboard.json",
        );
    }
    assert!(used.contains_key("outbox_lag_seconds"), "{used:?}");

    let unknown: Vec<String> = used
        .iter()
        .filter(|(name, _)| !is_emitted(name, &emitted))
        .map(|(name, files)| format!("{name} (in {})", Vec::from_iter(files.clone()).join(", ")))
        .collect();
    assert!(
        unknown.is_empty(),
        "queried but emitted by no crate: {}\nemitted: {emitted:?}",
        unknown.join("; ")
    );
}

#[test]
fn metric_names_are_what_promql_selects() {
    let expr = r#"sum by (job, scope) (rate(a_total{job=~"$job", outcome="b_total"}[$__rate_interval]))
        / on (job) group_left (scope) b_seconds > 0.1 unless c offset 5m or histogram_quantile(0.9, d_bucket)"#;
    assert_eq!(
        metric_names(expr),
        BTreeSet::from(["a_total", "b_seconds", "c", "d_bucket"].map(String::from))
    );
    assert_eq!(
        metric_names(r#"x_total{job="a",scope="POST"}"#),
        BTreeSet::from(["x_total".to_owned()])
    );
}

#[test]
fn emitted_names_come_from_literals_and_constants() {
    let source = r#"
        pub const REQUESTS: &str = "requests_total";
        metrics::counter!("literal_total", "scope" => s).increment(1);
        metrics::gauge!(REQUESTS).set(1.0);
        metrics::histogram!(
            observe::LATENCY
        ).record(1.0);
        const LATENCY: &str = "latency_seconds";
    "#;
    assert_eq!(
        names_in_source(source, &BTreeMap::new()),
        Ok(BTreeSet::from(
            ["literal_total", "requests_total", "latency_seconds"].map(String::from)
        ))
    );
}

fn read(path: &Path) -> String {
    fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

fn note(used: &mut BTreeMap<String, BTreeSet<String>>, names: BTreeSet<String>, file: &str) {
    for name in names {
        used.entry(name).or_default().insert(file.to_owned());
    }
}

fn is_emitted(name: &str, emitted: &BTreeSet<String>) -> bool {
    emitted.contains(name)
        || SERIES_SUFFIXES.iter().any(|suffix| {
            name.strip_suffix(suffix)
                .is_some_and(|base| emitted.contains(base))
        })
}

/// Every metric name in the `.rs` files under `crates/*/src`.
fn emitted_metrics(crates: &Path) -> BTreeSet<String> {
    let mut files = Vec::new();
    for entry in fs::read_dir(crates).expect("the crates directory") {
        rust_files(&entry.expect("a crate").path().join("src"), &mut files);
    }
    let sources: Vec<(PathBuf, String)> =
        files.into_iter().map(|f| (f.clone(), read(&f))).collect();
    // Constants may be used outside the file that defines them.
    let mut constants = BTreeMap::new();
    for (_, source) in &sources {
        constants.extend(string_constants(source));
    }
    let mut names = BTreeSet::new();
    for (file, source) in &sources {
        match names_in_source(source, &constants) {
            Ok(found) => names.extend(found),
            Err(argument) => panic!(
                "{}: a metric named by `{argument}`, which is neither a string literal nor a `const` holding one",
                file.display()
            ),
        }
    }
    names
}

fn rust_files(dir: &Path, into: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            rust_files(&path, into);
        } else if path.extension().is_some_and(|e| e == "rs") {
            into.push(path);
        }
    }
}

/// `const NAME: &str = "value";` in `source`.
fn string_constants(source: &str) -> BTreeMap<String, String> {
    let mut constants = BTreeMap::new();
    for line in source.lines() {
        let Some((_, rest)) = line.split_once("const ") else {
            continue;
        };
        let Some((name, rest)) = rest.split_once(": &str = \"") else {
            continue;
        };
        let Some((value, _)) = rest.split_once('"') else {
            continue;
        };
        constants.insert(name.trim().to_owned(), value.to_owned());
    }
    constants
}

/// The names the metric macros in `source` emit, resolving constants in
/// `source` first and then in `constants`; `Err` with the argument when one
/// cannot be resolved.
fn names_in_source(
    source: &str,
    constants: &BTreeMap<String, String>,
) -> Result<BTreeSet<String>, String> {
    let local = string_constants(source);
    let mut names = BTreeSet::new();
    for macro_call in METRIC_MACROS {
        for (at, _) in source.match_indices(macro_call) {
            let argument = source[at + macro_call.len()..].trim_start();
            if let Some(literal) = argument.strip_prefix('"') {
                let (name, _) = literal.split_once('"').expect("a closed string literal");
                names.insert(name.to_owned());
                continue;
            }
            let path: String = argument
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':')
                .collect();
            let constant = path.rsplit("::").next().unwrap_or_default();
            match local.get(constant).or_else(|| constants.get(constant)) {
                Some(name) => names.insert(name.clone()),
                None => return Err(path),
            };
        }
    }
    Ok(names)
}

/// The values of `key` in a YAML file: plain or quoted scalars on the key's
/// line, or a block scalar (`|`, `>`) on the lines indented under it.
fn yaml_values(yaml: &str, key: &str) -> Vec<String> {
    let lines: Vec<&str> = yaml.lines().collect();
    let mut values = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let body = line.trim_start().trim_start_matches("- ");
        let Some(value) = body.strip_prefix(key).and_then(|v| v.strip_prefix(':')) else {
            continue;
        };
        let value = value.trim();
        if value.starts_with('|') || value.starts_with('>') {
            let indent = line.len() - line.trim_start().len();
            let block: Vec<&str> = lines[i + 1..]
                .iter()
                .take_while(|l| l.trim().is_empty() || l.len() - l.trim_start().len() > indent)
                .copied()
                .collect();
            values.push(block.join("\n"));
        } else {
            let unquoted = value
                .strip_prefix('\'')
                .and_then(|v| v.strip_suffix('\''))
                .or_else(|| value.strip_prefix('"').and_then(|v| v.strip_suffix('"')))
                .unwrap_or(value);
            values.push(unquoted.to_owned());
        }
    }
    values
}

/// Every string under `key` anywhere in `value`.
fn json_strings(value: &serde_json::Value, key: &str, into: &mut Vec<String>) {
    match value {
        serde_json::Value::Object(map) => {
            for (k, v) in map {
                match v {
                    serde_json::Value::String(s) if k == key => into.push(s.clone()),
                    _ => json_strings(v, key, into),
                }
            }
        }
        serde_json::Value::Array(items) => items.iter().for_each(|v| json_strings(v, key, into)),
        _ => {}
    }
}

/// The metric names a PromQL expression selects: identifiers that are not
/// functions (followed by `(`), keywords, label names (inside `{}` or after
/// `by`, `on` and the like), durations (inside `[]`) or numbers.
fn metric_names(expr: &str) -> BTreeSet<String> {
    let text = without_enclosed(&without_strings(expr), '{', '}');
    let text = without_label_lists(&without_enclosed(&text, '[', ']'));
    let chars: Vec<char> = text.chars().collect();
    let mut names = BTreeSet::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_ascii_digit() || c == '.' {
            // A number, its exponent included.
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '.') {
                i += 1;
            }
            continue;
        }
        if !is_word_start(c) {
            i += 1;
            continue;
        }
        let (word, end) = word_at(&chars, i);
        let after_variable = i > 0 && chars[i - 1] == '$';
        let is_function = chars[end..].iter().find(|c| !c.is_whitespace()) == Some(&'(');
        let lower = word.to_ascii_lowercase();
        let is_keyword =
            KEYWORDS.contains(&lower.as_str()) || LABEL_LISTS.contains(&lower.as_str());
        if !is_function && !is_keyword && !after_variable {
            names.insert(word);
        }
        i = end;
    }
    names
}

fn is_word_start(c: char) -> bool {
    c.is_ascii_alphabetic() || c == '_' || c == ':'
}

/// The identifier starting at `start`, and the index after it.
fn word_at(chars: &[char], start: usize) -> (String, usize) {
    let mut end = start;
    while end < chars.len()
        && (chars[end].is_ascii_alphanumeric() || chars[end] == '_' || chars[end] == ':')
    {
        end += 1;
    }
    (chars[start..end].iter().collect(), end)
}

/// `text` without label lists: `by (job)`, `on (job)`, `group_left (scope)`...
fn without_label_lists(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < chars.len() {
        if !is_word_start(chars[i]) || (i > 0 && chars[i - 1] == '$') {
            out.push(chars[i]);
            i += 1;
            continue;
        }
        let (word, end) = word_at(&chars, i);
        let open = (end..chars.len()).find(|&j| !chars[j].is_whitespace());
        match open {
            Some(j) if chars[j] == '(' && LABEL_LISTS.contains(&word.as_str()) => {
                let close = (j..chars.len()).find(|&k| chars[k] == ')');
                i = close.map_or(chars.len(), |k| k + 1);
                out.push(' ');
            }
            _ => {
                out.push_str(&word);
                i = end;
            }
        }
    }
    out
}

/// `expr` with its string literals emptied (label values, not names).
fn without_strings(expr: &str) -> String {
    let mut out = String::with_capacity(expr.len());
    let mut quote = None;
    let mut escaped = false;
    for c in expr.chars() {
        match quote {
            Some(q) => {
                if escaped {
                    escaped = false;
                } else if c == '\\' {
                    escaped = true;
                } else if c == q {
                    quote = None;
                    out.push(c);
                }
            }
            None => {
                if c == '"' || c == '\'' || c == '`' {
                    quote = Some(c);
                }
                out.push(c);
            }
        }
    }
    out
}

/// `text` without what lies between `open` and `close`.
fn without_enclosed(text: &str, open: char, close: char) -> String {
    let mut out = String::with_capacity(text.len());
    let mut depth = 0usize;
    for c in text.chars() {
        if c == open {
            depth += 1;
        } else if c == close {
            depth = depth.saturating_sub(1);
        } else if depth == 0 {
            out.push(c);
        }
    }
    out
}
