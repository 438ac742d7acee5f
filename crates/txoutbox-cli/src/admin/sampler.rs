//! Database-backed gauges, the dashboard's short history and the status document's counts,
//! refreshed on an interval (not per scrape or request): one counts query per tick, however
//! many scrapers, dashboards or `/api/v1/status` callers there are.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use metrics_exporter_prometheus::PrometheusHandle;
use serde::Serialize;
use tokio_util::sync::CancellationToken;
use txoutbox::metrics as m;
use txoutbox::store::Operator;

use super::error::Outage;
use crate::cmd::slot::{SlotReader, SlotStatus};

/// Samples kept for the dashboard's chart (at 5 s: the last 15 minutes).
const KEEP: usize = 180;

/// One point of the dashboard's chart.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Sample {
    /// Unix time, seconds.
    pub t: f64,
    pub pending: i64,
    pub leased: i64,
    pub dead: i64,
    /// Events acknowledged per second since the previous sample.
    pub published_per_sec: f64,
    /// Mean commit-to-publish latency of the events published since the previous sample.
    pub latency_secs: Option<f64>,
}

/// The last [`KEEP`] samples, and the last full reading for `/api/v1/status`.
#[derive(Debug)]
pub struct History {
    inner: Mutex<State>,
    latest: Mutex<Option<Latest>>,
    /// The WAL source's replication slot at the last reading (PostgreSQL, when it exists).
    slot: Mutex<Option<SlotStatus>>,
    /// The admin queries of the outbox's database, the sampler's and the API's: while they
    /// fail, the last reading is stale (logged once per outage).
    queries: Outage,
    /// The slot's readings: a failure keeps the last one (logged once per outage too, unless
    /// it is part of an outage of `queries`).
    slot_reads: Outage,
}

impl Default for History {
    fn default() -> Self {
        Self {
            inner: Mutex::default(),
            latest: Mutex::default(),
            slot: Mutex::default(),
            queries: Outage::new("admin queries of the database"),
            slot_reads: Outage::new("reads of the replication slot for the status"),
        }
    }
}

/// The newest reading: what `/api/v1/status` answers with, without a query of its own.
#[derive(Debug, Clone)]
pub struct Latest {
    pub counts: txoutbox::store::Counts,
    pub relays: Vec<txoutbox::store::RelayInfo>,
    /// When the counts were read.
    pub at: chrono::DateTime<chrono::Utc>,
}

#[derive(Debug, Default)]
struct State {
    samples: VecDeque<Sample>,
    /// (time, published_total, latency sum, latency count) at the previous sample.
    last: Option<(f64, f64, f64, f64)>,
}

impl History {
    pub fn samples(&self) -> Vec<Sample> {
        self.inner
            .lock()
            .map(|s| s.samples.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// The admin queries of the outbox's database: whether they fail, since when.
    pub fn queries(&self) -> &Outage {
        &self.queries
    }

    /// Since when the newest reading is stale: the time of the first failure of the outage
    /// of the database's admin queries under way; `None` while they answer.
    pub fn stale_since(&self) -> Option<chrono::DateTime<chrono::Utc>> {
        self.queries.down().map(|d| d.since)
    }

    /// The newest reading, if one was taken yet.
    pub fn latest(&self) -> Option<Latest> {
        self.latest.lock().ok().and_then(|l| l.clone())
    }

    /// The replication slot at the last reading; `None` when it does not exist (or the
    /// database is not PostgreSQL).
    pub fn slot(&self) -> Option<SlotStatus> {
        self.slot.lock().ok().and_then(|s| s.clone())
    }

    fn set_slot(&self, slot: Option<SlotStatus>) {
        if let Ok(mut s) = self.slot.lock() {
            *s = slot;
        }
    }

    fn set_latest(&self, latest: Latest) {
        if let Ok(mut l) = self.latest.lock() {
            *l = Some(latest);
        }
    }

    fn push(&self, c: &txoutbox::store::Counts, totals: (f64, f64, f64)) {
        let t = chrono::Utc::now().timestamp_millis() as f64 / 1000.0;
        self.push_at(t, c, totals);
    }

    fn push_at(&self, t: f64, c: &txoutbox::store::Counts, totals: (f64, f64, f64)) {
        let Ok(mut s) = self.inner.lock() else { return };
        let (published_per_sec, latency_secs) = match s.last {
            Some((t0, p0, sum0, n0)) if t > t0 => {
                let n = totals.2 - n0;
                (
                    ((totals.0 - p0) / (t - t0)).max(0.0),
                    (n > 0.0).then(|| (totals.1 - sum0) / n),
                )
            }
            _ => (0.0, None),
        };
        s.last = Some((t, totals.0, totals.1, totals.2));
        s.samples.push_back(Sample {
            t,
            pending: c.pending,
            leased: c.leased,
            dead: c.dead,
            published_per_sec,
            latency_secs,
        });
        while s.samples.len() > KEEP {
            s.samples.pop_front();
        }
    }
}

/// Refresh the gauges and the history (and the slot's reading, given a `slot`) every
/// `every` until `cancel`.
#[allow(clippy::too_many_arguments)]
pub async fn run(
    store: Arc<dyn Operator>,
    metrics: Option<PrometheusHandle>,
    history: Arc<History>,
    slot: Option<SlotReader>,
    every: Duration,
    labels: m::MetricLabels,
    cancel: CancellationToken,
) {
    let mut progress = Progress::default();
    loop {
        if let Some((counts, totals)) = refresh(&*store, metrics.as_ref(), &history, &labels).await
        {
            progress.observe(&counts, totals.0, every);
        }
        if let Some(slot) = &slot {
            refresh_slot(&*store, slot, &history).await;
        }
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
    }
}

/// Read the counts into the gauges and the history; what was read (the counts, and the
/// totals of [`totals`]), or `None` when the database did not answer.
pub async fn refresh(
    store: &dyn Operator,
    metrics: Option<&PrometheusHandle>,
    history: &History,
    labels: &m::MetricLabels,
) -> Option<(txoutbox::store::Counts, (f64, f64, f64))> {
    let at = chrono::Utc::now();
    match store.counts().await {
        Ok(c) => {
            history.queries.answered();
            // The relays table is small; a failure there keeps the last list.
            let relays = match store.relays().await {
                Ok(r) => r,
                Err(e) => {
                    let e = txoutbox::redact::redact_secrets(&e.to_string());
                    tracing::warn!(error = %e, "could not read the relays for the status");
                    history.latest().map(|l| l.relays).unwrap_or_default()
                }
            };
            history.set_latest(Latest {
                counts: c.clone(),
                relays,
                at,
            });
            ::metrics::gauge!(m::PENDING, labels.labels()).set(c.pending as f64);
            ::metrics::gauge!(m::LEASED, labels.labels()).set(c.leased as f64);
            ::metrics::gauge!(m::DEAD, labels.labels()).set(c.dead as f64);
            ::metrics::gauge!(m::OLDEST_PENDING_AGE_SECONDS, labels.labels())
                .set(c.oldest_pending_age_secs.unwrap_or(0.0).max(0.0));
            let totals = metrics.map(|h| totals(h, labels)).unwrap_or_default();
            history.push(&c, totals);
            Some((c, totals))
        }
        Err(e) => {
            // Logged once per outage (the gauges and the status keep the last reading).
            history
                .queries
                .failed(&format!("refreshing the outbox gauges: {e}"));
            None
        }
    }
}

/// The relay's way through a backlog: at each reading while events have waited a whole
/// interval or more (a drain, a catch-up after an outage), an INFO line with what is
/// published, what is left and the rate; one more when the backlog is gone. Quiet otherwise.
#[derive(Debug, Default)]
struct Progress {
    /// A backlog was reported and has not been seen cleared yet.
    reported: bool,
    /// (when, published total) at the previous reading.
    last: Option<(std::time::Instant, f64)>,
}

impl Progress {
    fn observe(&mut self, c: &txoutbox::store::Counts, published: f64, every: Duration) {
        let now = std::time::Instant::now();
        let rate = match self.last {
            Some((t, p)) if now > t => ((published - p) / (now - t).as_secs_f64()).max(0.0),
            _ => 0.0,
        };
        self.last = Some((now, published));
        let waiting = c.pending + c.leased;
        let oldest = c.oldest_pending_age_secs.unwrap_or(0.0).max(0.0);
        if waiting > 0 && oldest >= every.as_secs_f64() {
            self.reported = true;
            tracing::info!(
                published = published as u64,
                pending = c.pending,
                leased = c.leased,
                rate = %format!("{rate:.0}/s"),
                oldest_pending_age = %txoutbox::relay::format_duration(Duration::from_secs(oldest as u64)),
                "backlog: progress"
            );
        } else if self.reported && waiting == 0 {
            self.reported = false;
            tracing::info!(published = published as u64, "backlog cleared");
        }
    }
}

/// Read the replication slot; a failure keeps the last reading (logged once per outage).
/// A failure because the database is down is that outage's (logged once, as the queries'):
/// when the slot read fails, a trivial query on the pool tells which it is, whichever of the
/// two met the outage first.
pub async fn refresh_slot(store: &dyn Operator, slot: &SlotReader, history: &History) {
    match slot.read().await {
        Ok(s) => {
            history.slot_reads.answered();
            history.set_slot(s);
        }
        // While the database's queries fail (the same outage, logged already), quietly.
        Err(_) if history.queries.down().is_some() => {}
        Err(e) => match store.ping().await {
            Err(down) => {
                history
                    .queries
                    .failed(&format!("reading {}: {down}", slot.name()));
            }
            Ok(()) => {
                history
                    .slot_reads
                    .failed(&format!("reading {}: {e:#}", slot.name()));
            }
        },
    }
}

/// (published total, commit-to-publish latency sum, count) of the relay with `labels`, from
/// the rendered exposition.
fn totals(h: &PrometheusHandle, labels: &m::MetricLabels) -> (f64, f64, f64) {
    let text = h.render();
    let v = |name: &str| value(&text, &series(name, labels)).unwrap_or(0.0);
    (
        v(m::PUBLISHED_TOTAL),
        v(&format!("{}_sum", m::COMMIT_TO_PUBLISH_SECONDS)),
        v(&format!("{}_count", m::COMMIT_TO_PUBLISH_SECONDS)),
    )
}

/// How the exposition writes the series `name` with exactly `labels` (in their order).
pub fn series(name: &str, labels: &m::MetricLabels) -> String {
    if labels.is_empty() {
        return name.to_string();
    }
    let inner: Vec<String> = labels
        .iter()
        .map(|(k, v)| format!("{k}=\"{}\"", v.replace('\\', "\\\\").replace('"', "\\\"")))
        .collect();
    format!("{name}{{{}}}", inner.join(","))
}

/// The value of a series (as [`series`] writes it) in Prometheus text format.
pub fn value(text: &str, name: &str) -> Option<f64> {
    text.lines().find_map(|l| {
        l.strip_prefix(name)
            .and_then(|rest| rest.strip_prefix(' '))
            .and_then(|v| v.trim().parse().ok())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_unlabelled_series() {
        let text = "# TYPE a counter\na_total 12\na_total_x 3\nb{x=\"1\"} 4\nb_sum 1.5\n";
        assert_eq!(value(text, "a_total"), Some(12.0));
        assert_eq!(value(text, "b_sum"), Some(1.5));
        assert_eq!(value(text, "b"), None);
        let labels = m::MetricLabels::outbox("o1");
        let text = "a_total{outbox=\"o1\"} 5\na_total{outbox=\"o2\"} 7\n";
        assert_eq!(series("a_total", &labels), "a_total{outbox=\"o1\"}");
        assert_eq!(value(text, &series("a_total", &labels)), Some(5.0));
        assert_eq!(value(text, "a_total"), None);
    }

    #[test]
    fn history_computes_rates() {
        let h = History::default();
        let c = txoutbox::store::Counts::default();
        h.push_at(100.0, &c, (10.0, 1.0, 10.0));
        h.push_at(105.0, &c, (20.0, 3.0, 20.0));
        let s = h.samples();
        assert_eq!(s.len(), 2);
        assert_eq!(s[1].published_per_sec, 2.0);
        assert_eq!(s[1].latency_secs, Some(0.2));
    }

    /// Progress is logged while events have waited an interval or more, not for events that
    /// just arrived (steady traffic), and "cleared" once, when none wait.
    #[test]
    fn progress_is_reported_while_a_backlog_lasts() {
        let c = |pending, age| txoutbox::store::Counts {
            pending,
            oldest_pending_age_secs: age,
            ..Default::default()
        };
        let every = Duration::from_secs(5);
        let mut p = Progress::default();
        p.observe(&c(40, Some(0.2)), 0.0, every);
        assert!(!p.reported, "events that just arrived are no backlog");
        p.observe(&c(200_000, Some(12.0)), 100.0, every);
        assert!(p.reported);
        p.observe(&c(150_000, Some(9.0)), 50_100.0, every);
        assert!(p.reported);
        p.observe(&c(0, None), 200_100.0, every);
        assert!(!p.reported, "cleared");
        p.observe(&c(0, None), 200_100.0, every);
        assert!(!p.reported);
    }
}
