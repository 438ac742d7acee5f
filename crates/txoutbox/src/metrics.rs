//! Metric names, recorded through the `metrics` facade: install any recorder (the daemon
//! installs a Prometheus one) and they appear; without one they cost next to nothing.
//!
//! The first four are the seed's names.

/// Counter: events the broker acknowledged.
pub const PUBLISHED_TOTAL: &str = "outbox_events_published_total";
/// Counter, label `event_type`: failed publish attempts.
pub const FAILED_TOTAL: &str = "outbox_events_failed_total";
/// Gauge: events not yet published and not dead (refreshed from the database).
pub const PENDING: &str = "outbox_events_pending";
/// Histogram: seconds per claim -> publish -> settle cycle.
pub const BATCH_DURATION_SECONDS: &str = "outbox_batch_duration_seconds";
/// Counter, label `event_type`: events dead-lettered by the relay.
pub const DEAD_LETTERED_TOTAL: &str = "outbox_events_dead_lettered_total";
/// Histogram: seconds from the event's `created_at` (its insert) to the broker's
/// acknowledgement.
pub const COMMIT_TO_PUBLISH_SECONDS: &str = "outbox_commit_to_publish_seconds";
/// Gauge: partitions this relay owns (ordered mode).
pub const PARTITIONS_OWNED: &str = "outbox_relay_partitions_owned";
/// Counter: events claimed.
pub const CLAIMED_TOTAL: &str = "outbox_events_claimed_total";
/// Counter: claimed events given back unattempted (shutdown, lease running out).
pub const RELEASED_TOTAL: &str = "outbox_events_released_total";
/// Counter: settles that did not take effect because the lease had moved to another relay.
pub const FENCED_TOTAL: &str = "outbox_settles_fenced_total";
/// Gauge: events leased by a relay right now (refreshed from the database).
pub const LEASED: &str = "outbox_events_leased";
/// Gauge: dead letters waiting for an operator (refreshed from the database).
pub const DEAD: &str = "outbox_events_dead";
/// Gauge: age in seconds of the oldest pending event, 0 when none (refreshed from the database).
pub const OLDEST_PENDING_AGE_SECONDS: &str = "outbox_oldest_pending_age_seconds";
/// Gauge, label `relay_id`: always 1; names the relay behind this endpoint.
pub const RELAY_INFO: &str = "outbox_relay_info";
/// Counter: published events deleted by the retention purge.
pub const PURGED_TOTAL: &str = "outbox_events_purged_total";
/// Counter, label `reason` (`queue_full`, `export_failed`): trace spans the daemon's OTLP
/// export dropped rather than hold up the relay.
pub const SPANS_DROPPED_TOTAL: &str = "outbox_trace_spans_dropped_total";

/// Gauge: WAL written since the WAL source's slot was last confirmed, in bytes
/// (`pg_current_wal_lsn() - confirmed_flush_lsn`; sampled every few seconds): what the relay
/// has not confirmed ([`WAL_SLOT_RETAINED_BYTES`] is what the server keeps).
pub const WAL_SLOT_LAG_BYTES: &str = "outbox_wal_slot_lag_bytes";
/// Gauge: WAL the server keeps for the WAL source's slot, in bytes (`pg_current_wal_lsn() -
/// restart_lsn`; sampled every few seconds): the slot's cost in disk, which a stream decodes
/// again from its start.
pub const WAL_SLOT_RETAINED_BYTES: &str = "outbox_wal_slot_retained_bytes";
/// Gauge: seconds from the commit of the last transaction the WAL source read to its reading
/// (0 once it has caught up): how far behind the stream the relay is.
pub const WAL_LAG_SECONDS: &str = "outbox_wal_lag_seconds";
/// Gauge: the slot's confirmed position (`confirmed_flush_lsn`) as a byte offset.
pub const WAL_CONFIRMED_LSN: &str = "outbox_wal_confirmed_lsn";
/// Gauge: WAL that may still be written before the slot is invalidated
/// (`safe_wal_size`, bytes); absent while `max_slot_wal_keep_size` is unlimited.
pub const WAL_SAFE_WAL_SIZE_BYTES: &str = "outbox_wal_safe_wal_size_bytes";
/// Gauge: 1 while a relay reads the WAL source's slot (`pg_replication_slots.active`, or a
/// relay holds the slot's reader lock); reported by every relay of the slot, standbys too.
pub const WAL_SLOT_ACTIVE: &str = "outbox_wal_slot_active";
/// Gauge, label `status` (`reserved`, `extended`, `unreserved`, `lost`): 1 for the slot's
/// `wal_status` now, 0 for the others.
pub const WAL_SLOT_STATUS: &str = "outbox_wal_slot_status";
/// Counter: events the WAL source handed to the table path (failed, held behind a failed one
/// of their aggregate, or committed before the slot existed).
pub const WAL_HANDED_OFF_TOTAL: &str = "outbox_wal_handed_off_total";
/// Counter: times the WAL source found its slot gone or lost and created it again.
pub const WAL_SLOT_RECREATED_TOTAL: &str = "outbox_wal_slot_recreated_total";
/// Counter: stretches of WAL whose tableless events were lost with the slot (it was lost
/// before the relay confirmed past them): each is also an `ERROR` log naming the range.
pub const WAL_TABLELESS_GAP_TOTAL: &str = "outbox_wal_tableless_gap_total";

/// Counter, label `route`: events the route's broker acknowledged (with a
/// [`Router`](crate::publish::Router); counted at the acknowledgement, so it also counts a
/// delivery whose settle the relay then lost, which the broker did get).
pub const ROUTE_PUBLISHED_TOTAL: &str = "outbox_route_published_total";
/// Counter, label `route`: publish attempts through the route that failed.
pub const ROUTE_FAILED_TOTAL: &str = "outbox_route_failed_total";
/// Counter: events that matched no route (each is dead-lettered, `no route matched`).
pub const ROUTE_UNMATCHED_TOTAL: &str = "outbox_route_unmatched_total";

/// The values `pg_replication_slots.wal_status` takes, for [`WAL_SLOT_STATUS`].
pub const WAL_STATUSES: [&str; 4] = ["reserved", "extended", "unreserved", "lost"];

/// Labels a relay adds to every metric it records, e.g. `outbox="orders"` when one process
/// runs several outboxes (the daemon's `[[outbox]]` entries): set
/// [`RelayConfig::metric_labels`](crate::relay::RelayConfig), and the same on the
/// [`Router`](crate::publish::Router) and [`Purger`](crate::retention::Purger) beside it.
/// Empty by default: a relay alone records the plain series.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MetricLabels(Vec<::metrics::Label>);

static NO_LABELS: MetricLabels = MetricLabels(Vec::new());

/// A label name Prometheus refuses (it must match `[a-zA-Z_][a-zA-Z0-9_]*` and not start
/// with `__`), or one given twice.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("metric label `{0}`: {1}")]
pub struct InvalidLabel(pub String, pub &'static str);

impl MetricLabels {
    /// No labels (shared, for what takes a reference).
    pub fn none() -> &'static MetricLabels {
        &NO_LABELS
    }

    /// `outbox="name"`: the label of one of several outboxes in a process.
    pub fn outbox(name: &str) -> Self {
        Self(vec![shared_label("outbox", name)])
    }

    /// These labels and `name="value"`, checked: the name must be a Prometheus label name
    /// that none of the labels has yet, and not one the relay sets itself (`event_type`,
    /// `route`, `status`, `reason`).
    pub fn with(mut self, name: &str, value: &str) -> Result<Self, InvalidLabel> {
        let bad = |why| Err(InvalidLabel(name.to_string(), why));
        let mut chars = name.chars();
        let first_ok = chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
        if !first_ok || !chars.all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return bad("a label name is a letter or `_`, then letters, digits or `_`");
        }
        if name.starts_with("__") {
            return bad("names starting with `__` are reserved to Prometheus");
        }
        if ["event_type", "route", "status", "reason", "relay_id"].contains(&name) {
            return bad("the relay sets this label itself");
        }
        if self.0.iter().any(|l| l.key() == name) {
            return bad("given twice");
        }
        self.0.push(shared_label(name, value));
        Ok(self)
    }

    /// The labels, in the order given.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|l| (l.key(), l.value()))
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The labels, for a `metrics` macro: one small vector per call (the names and values are
    /// shared, not copied; none at all without labels), as a relay records per event.
    pub fn labels(&self) -> Vec<::metrics::Label> {
        self.0.clone()
    }

    /// These labels and `name="value"` for one of the labels the relay sets itself (`route`),
    /// unchecked and shared like the others.
    pub(crate) fn plus(&self, name: &'static str, value: &str) -> Self {
        let mut l = self.0.clone();
        l.push(shared_label(name, value));
        Self(l)
    }

    /// The labels and one more (`event_type`, `route`, ...), for a `metrics` macro.
    pub fn and(&self, name: &'static str, value: impl Into<String>) -> Vec<::metrics::Label> {
        let mut l = self.labels();
        l.push(::metrics::Label::new(name, value.into()));
        l
    }
}

/// A label whose name and value are reference-counted: cloning it copies no string.
fn shared_label(name: &str, value: &str) -> ::metrics::Label {
    let shared = |s: &str| ::metrics::SharedString::from_shared(std::sync::Arc::<str>::from(s));
    ::metrics::Label::new(shared(name), shared(value))
}

/// Describe every metric (units and help texts) to the installed recorder, and start every
/// series the relay records at zero, so that a relay that has published nothing yet exposes
/// them: a dashboard panel shows 0 rather than "no data", and `increase()` sees the first
/// event rather than a series born at 1 (Prometheus' own advice). The counters labelled
/// `event_type` start as one series without the label (it stays 0; the labelled series are
/// added as event types appear). The gauges read from the database are left to the first
/// sample: 0 pending before anyone looked would be a claim, not a measurement.
pub fn describe() {
    describe_for(&[MetricLabels::default()]);
}

/// [`describe`], starting the series of each relay of the process at zero under its labels
/// (one set per outbox; no unlabelled series unless one of the sets is empty).
pub fn describe_for(relays: &[MetricLabels]) {
    describe_only();
    for labels in relays {
        start_series(labels);
    }
    for reason in ["queue_full", "export_failed"] {
        ::metrics::counter!(SPANS_DROPPED_TOTAL, "reason" => reason).increment(0);
    }
}

fn start_series(labels: &MetricLabels) {
    for counter in [
        PUBLISHED_TOTAL,
        FAILED_TOTAL,
        DEAD_LETTERED_TOTAL,
        CLAIMED_TOTAL,
        RELEASED_TOTAL,
        FENCED_TOTAL,
        PURGED_TOTAL,
    ] {
        ::metrics::counter!(counter, labels.labels()).increment(0);
    }
    for histogram in [BATCH_DURATION_SECONDS, COMMIT_TO_PUBLISH_SECONDS] {
        // Registering the handle is enough for the exporter to render empty buckets.
        let _ = ::metrics::histogram!(histogram, labels.labels());
    }
    ::metrics::gauge!(PARTITIONS_OWNED, labels.labels()).set(0.0);
}

fn describe_only() {
    use ::metrics::{describe_counter, describe_histogram, Unit};
    describe_counter!(PUBLISHED_TOTAL, "Events the broker acknowledged.");
    describe_counter!(FAILED_TOTAL, "Failed publish attempts, by event type.");
    describe_histogram!(
        BATCH_DURATION_SECONDS,
        Unit::Seconds,
        "Duration of one claim, publish and settle cycle."
    );
    describe_counter!(DEAD_LETTERED_TOTAL, "Events dead-lettered, by event type.");
    describe_histogram!(
        COMMIT_TO_PUBLISH_SECONDS,
        Unit::Seconds,
        "Seconds from an event's insert to the broker's acknowledgement."
    );
    describe_counter!(CLAIMED_TOTAL, "Events claimed by this relay.");
    ::metrics::describe_gauge!(PARTITIONS_OWNED, "Partitions this relay owns.");
    describe_counter!(RELEASED_TOTAL, "Claimed events released unattempted.");
    describe_counter!(
        FENCED_TOTAL,
        "Settles refused because the lease had moved on."
    );
    use ::metrics::describe_gauge;
    describe_gauge!(
        PENDING,
        "Events not yet published and not dead, not leased."
    );
    describe_gauge!(LEASED, "Events leased by a relay right now.");
    describe_gauge!(DEAD, "Dead letters waiting for an operator.");
    describe_gauge!(
        OLDEST_PENDING_AGE_SECONDS,
        Unit::Seconds,
        "Age of the oldest unpublished, not-dead event (0 when none)."
    );
    describe_gauge!(RELAY_INFO, "Always 1; the relay_id label names this relay.");
    describe_counter!(
        PURGED_TOTAL,
        "Published events deleted by the retention purge."
    );
    describe_gauge!(
        WAL_SLOT_LAG_BYTES,
        Unit::Bytes,
        "WAL written since the WAL source's slot was last confirmed."
    );
    describe_gauge!(
        WAL_SLOT_RETAINED_BYTES,
        Unit::Bytes,
        "WAL the server keeps for the WAL source's slot (from its restart_lsn)."
    );
    describe_gauge!(
        WAL_LAG_SECONDS,
        Unit::Seconds,
        "Seconds from the commit of the last transaction read from the WAL to its reading (0 when caught up)."
    );
    describe_gauge!(
        WAL_CONFIRMED_LSN,
        "The WAL source slot's confirmed position, as a byte offset."
    );
    describe_gauge!(
        WAL_SAFE_WAL_SIZE_BYTES,
        Unit::Bytes,
        "WAL that may still be written before the slot is invalidated (max_slot_wal_keep_size)."
    );
    describe_gauge!(
        WAL_SLOT_ACTIVE,
        "1 while a relay reads the WAL source's slot."
    );
    describe_gauge!(
        WAL_SLOT_STATUS,
        "1 for the slot's wal_status now (label status), 0 for the others."
    );
    describe_counter!(
        WAL_HANDED_OFF_TOTAL,
        "Events the WAL source handed to the table path."
    );
    describe_counter!(
        WAL_SLOT_RECREATED_TOTAL,
        "Times the WAL source created its lost or dropped slot again."
    );
    describe_counter!(
        WAL_TABLELESS_GAP_TOTAL,
        "Stretches of WAL whose tableless events were lost with the WAL source's slot."
    );
    describe_counter!(
        ROUTE_PUBLISHED_TOTAL,
        "Events the broker of each route acknowledged, by route."
    );
    describe_counter!(ROUTE_FAILED_TOTAL, "Failed publish attempts, by route.");
    describe_counter!(
        ROUTE_UNMATCHED_TOTAL,
        "Events that matched no route (dead-lettered)."
    );
    describe_counter!(
        SPANS_DROPPED_TOTAL,
        "Trace spans dropped by the OTLP export (queue full, or the collector refused them)."
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_names_are_checked() {
        let l = MetricLabels::outbox("orders")
            .with("tenant", "a b")
            .unwrap();
        assert_eq!(
            l.iter().collect::<Vec<_>>(),
            [("outbox", "orders"), ("tenant", "a b")]
        );
        for bad in ["", "1x", "a-b", "__x", "outbox", "event_type", "route"] {
            let e = MetricLabels::outbox("o").with(bad, "v").unwrap_err();
            assert_eq!(e.0, bad);
        }
        let labels = MetricLabels::outbox("o").and("event_type", "e");
        assert_eq!(labels.len(), 2);
        assert_eq!(labels[1].key(), "event_type");
        assert!(MetricLabels::none().is_empty() && MetricLabels::none().labels().is_empty());
    }
}
