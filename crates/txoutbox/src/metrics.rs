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

/// Describe every metric (units and help texts) to the installed recorder.
pub fn describe() {
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
}
