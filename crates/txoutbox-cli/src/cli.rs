//! Command-line interface: every option also comes from the environment and the TOML file.

use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// txoutbox: a transactional outbox for PostgreSQL.
///
/// Services insert events into an outbox table in the same transaction as their business
/// rows; `txoutbox relay` publishes every committed event to a broker, at least once.
/// Settings come from flags, then environment variables, then the TOML file given with
/// --config (in that order of precedence).
#[derive(Debug, Parser)]
#[command(
    name = "txoutbox",
    version,
    propagate_version = true,
    max_term_width = 100
)]
pub struct Cli {
    #[command(flatten)]
    pub global: Global,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Args)]
pub struct Global {
    /// PostgreSQL URL, e.g. postgres://user@127.0.0.1:5432/app
    #[arg(long, env = "DATABASE_URL", global = true, hide_env_values = true)]
    pub database_url: Option<String>,
    /// Schema of the outbox table
    #[arg(
        long,
        env = "TXOUTBOX_SCHEMA",
        global = true,
        default_value = "public",
        hide_env_values = true
    )]
    pub schema: String,
    /// Name of the outbox table
    #[arg(
        long,
        env = "TXOUTBOX_TABLE",
        global = true,
        default_value = "outbox_events",
        hide_env_values = true
    )]
    pub table: String,
    /// TOML file with settings (keys are option names, e.g. `batch_size = 500`; relay
    /// options may sit under [relay])
    #[arg(long, env = "TXOUTBOX_CONFIG", global = true, hide_env_values = true)]
    pub config: Option<std::path::PathBuf>,
    /// Log format on stderr
    #[arg(
        long,
        env = "TXOUTBOX_LOG_FORMAT",
        global = true,
        value_enum,
        default_value = "text"
    )]
    pub log_format: LogFormat,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Create or upgrade the outbox schema (idempotent)
    Migrate,
    /// Write one event into the outbox (prints its id)
    Enqueue(EnqueueArgs),
    /// Run the relay: publish committed events to a broker until stopped (SIGTERM/SIGINT)
    Relay(RelayArgs),
    /// Show pending, leased, dead and processed counts
    Status(StatusArgs),
    /// Inspect, retry or discard dead letters
    #[command(subcommand)]
    Dlq(DlqCommand),
    /// Run the seed's order service end to end: orders and events in transactions (some
    /// rolled back), the relay, and a check that exactly the committed events were delivered
    Demo(DemoArgs),
}

#[derive(Debug, Args)]
pub struct EnqueueArgs {
    /// Aggregate type, e.g. order
    #[arg(long)]
    pub aggregate_type: String,
    /// Aggregate id, e.g. 42 (the ordering and partitioning key)
    #[arg(long)]
    pub aggregate_id: String,
    /// Event type, e.g. order.created
    #[arg(long)]
    pub event_type: String,
    /// Payload as JSON
    #[arg(long)]
    pub payload: String,
    /// Message header K=V (repeatable)
    #[arg(long = "header", value_name = "K=V")]
    pub headers: Vec<String>,
    /// Use this event id instead of a generated UUIDv7
    #[arg(long)]
    pub id: Option<uuid::Uuid>,
}

#[derive(Debug, Args)]
pub struct RelayArgs {
    /// Where to publish: nats://, amqp://, stdout:, file:PATH or null: (required)
    #[arg(long, env = "TXOUTBOX_PUBLISHER", hide_env_values = true)]
    pub publisher: Option<String>,
    #[command(flatten)]
    pub tuning: RelayTuning,
    /// Exit 0 once nothing is pending or leased
    #[arg(long, env = "TXOUTBOX_DRAIN")]
    pub drain: bool,
}

/// Relay settings shared by `relay` and `demo`.
#[derive(Debug, Args, Clone)]
pub struct RelayTuning {
    /// Events claimed per batch
    #[arg(long, env = "TXOUTBOX_BATCH_SIZE", default_value_t = 500, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub batch_size: u32,
    /// Messages awaiting broker acknowledgement at once, at most
    #[arg(long, env = "TXOUTBOX_MAX_IN_FLIGHT", default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub max_in_flight: u32,
    /// Fallback poll when no wake-up arrives (e.g. 500ms, 5s)
    #[arg(long, env = "TXOUTBOX_POLL_INTERVAL", default_value = "1s", value_parser = parse_duration)]
    pub poll_interval: Duration,
    /// How long a claim holds its events; a dead relay's events return after this
    #[arg(long, env = "TXOUTBOX_LEASE", default_value = "30s", value_parser = parse_duration)]
    pub lease: Duration,
    /// Failed attempts before an event is dead-lettered
    #[arg(long, env = "TXOUTBOX_MAX_ATTEMPTS", default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub max_attempts: u32,
    /// First retry delay (doubles per attempt, with jitter)
    #[arg(long, env = "TXOUTBOX_BACKOFF_BASE", default_value = "1s", value_parser = parse_duration)]
    pub backoff_base: Duration,
    /// Longest retry delay
    #[arg(long, env = "TXOUTBOX_BACKOFF_MAX", default_value = "1m", value_parser = parse_duration)]
    pub backoff_max: Duration,
    /// On shutdown, how long to wait for in-flight acknowledgements
    #[arg(long, env = "TXOUTBOX_SHUTDOWN_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    pub shutdown_timeout: Duration,
    /// What to do with published rows: keep them marked processed, or delete them
    #[arg(long, env = "TXOUTBOX_RETENTION", value_enum, default_value = "mark")]
    pub retention: RetentionArg,
    /// This relay's name in locked_by (default host:pid:random)
    #[arg(long, env = "TXOUTBOX_RELAY_ID")]
    pub relay_id: Option<String>,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum RetentionArg {
    Mark,
    Delete,
}

#[derive(Debug, Args)]
pub struct StatusArgs {
    /// Print JSON instead of a table
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Subcommand)]
pub enum DlqCommand {
    /// List dead letters, oldest first
    List {
        #[command(flatten)]
        filter: DlqFilter,
        /// At most this many
        #[arg(long, default_value_t = 100)]
        limit: i64,
        /// Print JSON lines instead of a table
        #[arg(long)]
        json: bool,
    },
    /// Put dead letters back in line (attempts reset): one by id, or --all matching the filters
    Retry(DlqTarget),
    /// Delete dead letters for good: one by id, or --all matching the filters
    Discard(DlqTarget),
}

#[derive(Debug, Args)]
pub struct DlqTarget {
    /// The event id
    #[arg(required_unless_present = "all", conflicts_with = "all")]
    pub id: Option<uuid::Uuid>,
    /// Every dead letter matching the filters
    #[arg(long)]
    pub all: bool,
    #[command(flatten)]
    pub filter: DlqFilter,
    /// Print JSON
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args, Clone, Default)]
pub struct DlqFilter {
    /// Only this event type
    #[arg(long)]
    pub event_type: Option<String>,
    /// Only this aggregate type
    #[arg(long)]
    pub aggregate_type: Option<String>,
    /// Only this aggregate id
    #[arg(long)]
    pub aggregate_id: Option<String>,
}

#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Where to publish (default: stdout:)
    #[arg(
        long,
        env = "TXOUTBOX_PUBLISHER",
        default_value = "stdout:",
        hide_env_values = true
    )]
    pub publisher: String,
    /// How many orders to write
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub orders: u32,
}

/// `500ms`, `5s`, `1m30s`; a bare number is seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    if let Ok(secs) = s.parse::<f64>() {
        if secs.is_finite() && secs >= 0.0 {
            return Ok(Duration::from_secs_f64(secs));
        }
    }
    humantime::parse_duration(s)
        .map_err(|e| format!("{s:?} is not a duration like 500ms, 5s or 1m ({e})"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("5s").unwrap(), Duration::from_secs(5));
        assert_eq!(parse_duration("2").unwrap(), Duration::from_secs(2));
        assert!(parse_duration("fast").is_err());
        assert!(parse_duration("-1").is_err());
    }
}
