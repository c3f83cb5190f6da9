//! The last hour at a glance: a sample every minute (or as often as asked)
//! of what the process counted (duplicates suppressed, key conflicts, from
//! its own metrics recorder) and of what the store holds (dead letters
//! waiting, outbox lag), kept in memory for an hour and drawn as small SVG
//! charts on the server, so the page needs no script to show them.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use idem::{AnyStore, DeadLetterStore, OutboxStore};
use maud::{Markup, html};
use metrics_exporter_prometheus::PrometheusHandle;
use serde::Serialize;
use utoipa::ToSchema;

/// How far back the charts go.
pub const WINDOW: Duration = Duration::from_secs(3600);

/// One sample.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Sample {
    at_ms: i64,
    duplicates: Option<f64>,
    conflicts: Option<f64>,
    dead_letters: Option<f64>,
    outbox_lag_s: Option<f64>,
}

/// The samples of the last hour.
#[derive(Debug, Default)]
pub struct Charts {
    samples: Mutex<VecDeque<Sample>>,
}

/// One point of a series.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, ToSchema)]
pub struct Point {
    /// When.
    pub at_ms: i64,
    /// The value.
    pub value: f64,
}

/// One chart's data.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct Series {
    /// What it shows.
    pub name: String,
    /// Its unit.
    pub unit: String,
    /// Where the figures come from.
    pub source: String,
    /// The points, oldest first.
    pub points: Vec<Point>,
    /// Why there are no points, when there are none.
    pub missing: Option<String>,
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// The sum of every series of counter `name` in Prometheus text.
fn counter(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|line| {
            line.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

impl Charts {
    /// Takes one sample now: the process's counters from `metrics` (when
    /// the process records them) and the store's dead-letter and outbox figures.
    pub async fn sample(&self, store: &AnyStore, metrics: Option<&PrometheusHandle>) {
        let now = store.outbox_clock().now();
        let text = metrics.map(PrometheusHandle::render);
        let dead_letters = match store.dead_letter_stats().await {
            Ok(stats) => Some(stats.waiting as f64),
            Err(error) => {
                tracing::debug!(%error, "no dead-letter figures for the charts");
                None
            }
        };
        let outbox_lag_s = match store.outbox_stats().await {
            Ok(stats) => Some(
                stats
                    .oldest_pending
                    .map_or(0.0, |oldest| oldest.until(now).as_secs_f64()),
            ),
            Err(error) => {
                tracing::debug!(%error, "no outbox figures for the charts");
                None
            }
        };
        let sample = Sample {
            at_ms: now_ms(),
            duplicates: text
                .as_deref()
                .map(|t| counter(t, idem::observe::DUPLICATES_SUPPRESSED_TOTAL)),
            conflicts: text
                .as_deref()
                .map(|t| counter(t, idem::observe::KEY_CONFLICTS_TOTAL)),
            dead_letters,
            outbox_lag_s,
        };
        let mut samples = self
            .samples
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        samples.push_back(sample);
        let since = sample.at_ms - WINDOW.as_millis() as i64;
        while samples.front().is_some_and(|s| s.at_ms < since) {
            samples.pop_front();
        }
    }

    /// Samples every `every` until the task is aborted.
    pub fn start(
        self: &Arc<Self>,
        store: AnyStore,
        metrics: Option<PrometheusHandle>,
        every: Duration,
    ) -> tokio::task::JoinHandle<()> {
        let charts = Arc::clone(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                charts.sample(&store, metrics.as_ref()).await;
            }
        })
    }

    /// The four series: counters as increases between samples, gauges as read.
    pub fn series(&self) -> Vec<Series> {
        let samples: Vec<Sample> = self
            .samples
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .iter()
            .copied()
            .collect();
        let increases = |pick: fn(&Sample) -> Option<f64>| -> Vec<Point> {
            samples
                .windows(2)
                .filter_map(|pair| {
                    let (before, after) = (pick(&pair[0])?, pick(&pair[1])?);
                    Some(Point {
                        at_ms: pair[1].at_ms,
                        value: (after - before).max(0.0),
                    })
                })
                .collect()
        };
        let read = |pick: fn(&Sample) -> Option<f64>| -> Vec<Point> {
            samples
                .iter()
                .filter_map(|s| {
                    Some(Point {
                        at_ms: s.at_ms,
                        value: pick(s)?,
                    })
                })
                .collect()
        };
        let process = "counted by this process";
        let store = "read from the store";
        let series = vec![
            Series {
                name: "duplicates suppressed".into(),
                unit: "per sample".into(),
                source: process.into(),
                points: increases(|s| s.duplicates),
                missing: None,
            },
            Series {
                name: "key conflicts".into(),
                unit: "per sample".into(),
                source: process.into(),
                points: increases(|s| s.conflicts),
                missing: None,
            },
            Series {
                name: "dead letters waiting".into(),
                unit: "letters".into(),
                source: store.into(),
                points: read(|s| s.dead_letters),
                missing: None,
            },
            Series {
                name: "outbox lag".into(),
                unit: "seconds".into(),
                source: store.into(),
                points: read(|s| s.outbox_lag_s),
                missing: None,
            },
        ];
        let counted = samples.iter().any(|s| s.duplicates.is_some());
        let kept = samples.iter().any(|s| s.dead_letters.is_some());
        series
            .into_iter()
            .map(|mut series| {
                let from_process = series.source == process;
                series.missing = series.points.is_empty().then(|| {
                    if from_process && !samples.is_empty() && !counted {
                        "this process counts no requests (idem console alone); the console of idem serve --admin-listen shows them"
                    } else if !from_process && !samples.is_empty() && !kept {
                        "this store keeps none"
                    } else {
                        "no samples yet: the first come within a minute of the start"
                    }
                    .to_owned()
                });
                series
            })
            .collect()
    }
}

/// A series as a small line chart: the last hour on the x axis, zero to the
/// largest value on the y axis.
pub fn chart(series: &Series) -> Markup {
    const W: f64 = 300.0;
    const H: f64 = 80.0;
    let end = now_ms() as f64;
    let start = end - WINDOW.as_millis() as f64;
    let top = series
        .points
        .iter()
        .map(|p| p.value)
        .fold(0.0_f64, f64::max)
        .max(1.0);
    let points: Vec<String> = series
        .points
        .iter()
        .map(|p| {
            let x = ((p.at_ms as f64 - start) / (end - start)).clamp(0.0, 1.0) * W;
            let y = H - (p.value / top) * (H - 4.0) - 2.0;
            format!("{x:.1},{y:.1}")
        })
        .collect();
    let last = series.points.last().map(|p| p.value);
    html! {
        figure.chart {
            figcaption {
                strong { (series.name) }
                " "
                span.muted { "(" (series.unit) ", " (series.source) ")" }
            }
            svg viewBox=(format!("0 0 {W} {H}")) width=(W) height=(H) role="img"
                aria-label=(format!("{} over the last hour", series.name)) {
                line.axis x1="0" y1=(H - 1.0) x2=(W) y2=(H - 1.0) {}
                @if points.len() > 1 {
                    polyline.series points=(points.join(" ")) {}
                } @else if let Some(point) = points.first() {
                    @let (x, y) = point.split_once(',').unwrap_or(("0", "0"));
                    circle.series cx=(x) cy=(y) r="2" {}
                }
                text.scale x="2" y="10" { "max " (format_value(top)) }
            }
            p.muted {
                @match last {
                    Some(value) => { "now " (format_value(value)) " · " (series.points.len()) " samples" },
                    None => { (series.missing.as_deref().unwrap_or("no figures")) },
                }
            }
        }
    }
}

fn format_value(value: f64) -> String {
    if value.fract() == 0.0 {
        format!("{value:.0}")
    } else {
        format!("{value:.1}")
    }
}

#[cfg(test)]
mod tests {
    use super::counter;

    #[test]
    fn counters_are_summed_over_their_labels_and_other_names_are_left_out() {
        let text = "# TYPE duplicates_suppressed_total counter\n\
                    duplicates_suppressed_total{scope=\"a\"} 3\n\
                    duplicates_suppressed_total{scope=\"b\"} 4\n\
                    duplicates_suppressed_total_other 100\n";
        assert_eq!(counter(text, "duplicates_suppressed_total"), 7.0);
        assert_eq!(counter(text, "idempotency_key_conflicts_total"), 0.0);
    }
}
