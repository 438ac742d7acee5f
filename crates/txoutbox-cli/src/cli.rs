//! Command-line interface: every option also comes from the environment and the TOML file.

use std::sync::LazyLock;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use txoutbox::duration::DurationRange;
use txoutbox::relay::{format_duration, Mode, OnDeadLetter, RelayConfig, Source};
use txoutbox::retention::Purger;
use txoutbox::OutboxTable;

use crate::values::{count, parse_bytes, parse_fraction, parse_slot, within};

mod operator;
mod replay;
pub use operator::*;
pub use replay::ReplayArgs;

/// The library's defaults, which the flags start from and `--help` shows: defined once, in
/// `RelayConfig::default()`, `Purger::default()` and `OutboxTable::default()`.
struct Defaults {
    relay: RelayConfig,
    purger: Purger,
    schema: String,
    table: String,
    poll_interval: String,
    lease: String,
    backoff_base: String,
    backoff_max: String,
    shutdown_timeout: String,
    partition_lease: String,
    retention_interval: String,
}

static DEFAULTS: LazyLock<Defaults> = LazyLock::new(|| {
    let relay = RelayConfig::default();
    let purger = Purger::default();
    let table = OutboxTable::default();
    Defaults {
        schema: table.schema().as_str().to_string(),
        table: table.table().as_str().to_string(),
        poll_interval: format_duration(relay.poll_interval),
        lease: format_duration(relay.lease),
        backoff_base: format_duration(relay.backoff.base),
        backoff_max: format_duration(relay.backoff.max),
        shutdown_timeout: format_duration(relay.shutdown_timeout),
        partition_lease: format_duration(relay.partition_lease),
        retention_interval: format_duration(purger.every),
        relay,
        purger,
    }
});

/// txoutbox: a transactional outbox for PostgreSQL, MySQL/MariaDB and SQLite.
///
/// Services insert events into an outbox table in the same transaction as their business
/// rows; `txoutbox relay` publishes every committed event to a broker, at least once.
/// Settings come from flags, then environment variables, then the TOML file given with
/// --config (in that order of precedence). Durations: 500ms, 5s, 1.5s, 1m30s, 2h, 7d (a
/// bare number is seconds), each within its setting's range.
#[derive(Debug, Parser)]
#[command(
    name = "txoutbox",
    version = crate::version::LONG,
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
    /// Database URL; its scheme picks the database: postgres://user@127.0.0.1:5432/app,
    /// mysql://user@127.0.0.1:3306/app (MySQL 8, MariaDB 10.6+) or sqlite://path/to/outbox.db
    /// (created if missing; one relay per file). PostgreSQL may name several hosts, tried in
    /// order, and the pool follows the one that serves after a failover:
    /// postgres://user@db1:5432,db2:5432/app?target_session_attrs=read-write
    #[arg(
        long,
        help_heading = "Database",
        env = "DATABASE_URL",
        global = true,
        hide_env_values = true
    )]
    pub database_url: Option<String>,
    /// File holding the database URL (e.g. a Docker or Kubernetes secret); a trailing
    /// newline is ignored. Instead of --database-url
    #[arg(
        long,
        help_heading = "Database",
        env = "DATABASE_URL_FILE",
        global = true,
        value_name = "PATH",
        conflicts_with = "database_url"
    )]
    pub database_url_file: Option<std::path::PathBuf>,
    /// Schema of the outbox table (MySQL: a database, `public` = the URL's; SQLite: only `public`)
    #[arg(
        long,
        help_heading = "Database",
        env = "TXOUTBOX_SCHEMA",
        global = true,
        default_value = DEFAULTS.schema.as_str(),
        hide_env_values = true
    )]
    pub schema: String,
    /// Name of the outbox table
    #[arg(
        long,
        help_heading = "Database",
        env = "TXOUTBOX_TABLE",
        global = true,
        default_value = DEFAULTS.table.as_str(),
        hide_env_values = true
    )]
    pub table: String,
    /// TOML file with settings (keys are option names, e.g. `batch_size = 500`; relay
    /// options may sit under [relay])
    #[arg(long, env = "TXOUTBOX_CONFIG", global = true, hide_env_values = true)]
    pub config: Option<std::path::PathBuf>,
    /// With [[outbox]] entries in the config file: act on this one only (`relay`, `status`
    /// and `migrate` take all of them without it; the other commands need it when there are
    /// several)
    #[arg(long, env = "TXOUTBOX_OUTBOX", global = true, value_name = "NAME")]
    pub outbox: Option<String>,
    /// Log format on stderr
    #[arg(
        long,
        env = "TXOUTBOX_LOG_FORMAT",
        global = true,
        value_enum,
        default_value = "pretty"
    )]
    pub log_format: LogFormat,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines (`text` is accepted too)
    #[value(alias = "text")]
    Pretty,
    /// One JSON object per line
    Json,
}

/// `txoutbox migrate`.
#[derive(Debug, Args)]
pub struct MigrateArgs {
    /// The source that will read the table (PostgreSQL). `wal`: the lean write path, for a
    /// table only the WAL source's stream reads: the wake-up trigger is disabled and the
    /// partition index dropped, so writers' inserts pay for neither. `table`: both put back.
    /// Unset: the table's write path is left as it is (see docs/wal.md, "A lean write path")
    #[arg(long, help_heading = "Source", env = "TXOUTBOX_SOURCE", value_enum)]
    pub source: Option<Source>,
}

// Parsed once per process: the size of the relay's variant does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Create or upgrade the outbox schema (idempotent); with --source wal, make the table's
    /// write path lean for the WAL source
    Migrate(MigrateArgs),
    /// Write one event into the outbox (prints its id)
    Enqueue(EnqueueArgs),
    /// Run the relay: publish committed events to a broker until stopped (SIGTERM/SIGINT);
    /// with [[outbox]] entries in the config file, one relay per outbox in this process
    Relay(RelayArgs),
    /// Show pending, leased, dead and processed counts (PostgreSQL: and the WAL source's
    /// replication slot, when it exists)
    Status(StatusArgs),
    /// The WAL source's replication slot (PostgreSQL only): list, create or drop it
    Slot(SlotArgs),
    /// Inspect, retry or discard dead letters
    #[command(subcommand)]
    Dlq(DlqCommand),
    /// List and inspect events in any state
    #[command(subcommand)]
    Events(EventsCommand),
    /// Publish retained events again (published rows the table still keeps), filtered by time,
    /// seq range, aggregate and type, to a publisher you name: e.g. for a consumer that lost
    /// its data. Read-only on the table; rate-limited with --rate; --dry-run counts
    Replay(ReplayArgs),
    /// Run the seed's order service end to end: orders and events in transactions (some
    /// rolled back), the relay, and a check that exactly the committed events were delivered.
    /// Without --database-url it runs on an SQLite file in the temporary directory
    Demo(DemoArgs),
    /// Print a shell completion script: bash, zsh, fish, elvish or powershell (e.g.
    /// `txoutbox completions bash > /usr/share/bash-completion/completions/txoutbox`)
    Completions(crate::cmd::completions::CompletionsArgs),
    /// Print the man page (roff; `txoutbox man | man -l -`), or write a page for every command
    /// into a directory with --dir
    Man(crate::cmd::man::ManArgs),
    /// Check a configuration before running it: `txoutbox [--config FILE] config check
    /// [RELAY OPTIONS]`
    #[command(subcommand)]
    Config(ConfigCommand),
}

#[derive(Debug, Subcommand)]
pub enum ConfigCommand {
    /// Print every setting `relay` would run with and where each came from (flag,
    /// environment variable, config file key, default), secrets masked; then check what
    /// `relay` checks before it connects, the database (reachable, migrated; for the WAL
    /// source, able to serve it) and each publisher URL (connected, then closed). No relay
    /// starts and nothing is written. Exit status 0: every check passed; 1: one failed; 2: a
    /// setting cannot work
    Check {
        /// `relay`'s options, as `txoutbox relay` takes them
        #[arg(
            trailing_var_arg = true,
            allow_hyphen_values = true,
            value_name = "RELAY OPTIONS"
        )]
        relay_options: Vec<String>,
    },
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
    /// Payload as JSON (or --bytes-file)
    #[arg(
        long,
        required_unless_present = "bytes_file",
        conflicts_with = "bytes_file"
    )]
    pub payload: Option<String>,
    /// Payload as the bytes of this file, sent as they are (Protobuf, Avro, ...); needs
    /// --content-type
    #[arg(long, value_name = "PATH", requires = "content_type")]
    pub bytes_file: Option<std::path::PathBuf>,
    /// Content type of --bytes-file, e.g. application/x-protobuf
    #[arg(long, value_name = "TYPE", requires = "bytes_file")]
    pub content_type: Option<String>,
    /// Message header K=V (repeatable)
    #[arg(long = "header", value_name = "K=V")]
    pub headers: Vec<String>,
    /// Use this event id instead of a generated UUIDv7
    #[arg(long)]
    pub id: Option<uuid::Uuid>,
}

#[derive(Debug, Args)]
pub struct RelayArgs {
    /// Where to publish: nats://, amqp://, redis://, mqtt://, kafka://, https://, sqs://QUEUE,
    /// sns://TOPIC_ARN, kinesis://STREAM, stdout:, file:PATH or null: (required unless the config file has
    /// [[route]] entries, after which it is the default route, or [[outbox]] entries with
    /// their own; the TLS forms tls://, amqps://,
    /// rediss://, mqtts://, kafkas://, https:// take tls_ca, tls_cert and tls_key parameters;
    /// sqs://, sns:// and kinesis:// take their credentials from the standard AWS chain)
    #[arg(
        long,
        help_heading = "Publisher",
        env = "TXOUTBOX_PUBLISHER",
        hide_env_values = true
    )]
    pub publisher: Option<String>,
    /// File holding the publisher URL (when it carries a password); a trailing newline is
    /// ignored. Instead of --publisher
    #[arg(
        long,
        help_heading = "Publisher",
        env = "TXOUTBOX_PUBLISHER_FILE",
        value_name = "PATH",
        conflicts_with = "publisher"
    )]
    pub publisher_file: Option<std::path::PathBuf>,
    /// The config file's `[[route]]` entries, in order (not a flag: routes live in the file).
    #[arg(skip)]
    pub routes: Vec<crate::config::RouteSpec>,
    /// Where committed events come from: `table` claims rows of the outbox table (every
    /// database); `wal` reads them from PostgreSQL's logical replication slot in commit order
    /// (PostgreSQL 14+, wal_level = logical, a role with REPLICATION; see docs/wal.md)
    #[arg(long, help_heading = "Source", env = "TXOUTBOX_SOURCE", value_enum, default_value_t = DEFAULTS.relay.source)]
    pub source: Source,
    /// With --source wal: the replication slot to read, created when missing (1 to 63 of
    /// a-z, 0-9, _) [default: txoutbox_<database>_<schema>_<table>]
    #[arg(long, help_heading = "Source", env = "TXOUTBOX_SLOT", value_name = "NAME", value_parser = parse_slot)]
    pub slot: Option<String>,
    #[command(flatten)]
    pub tuning: RelayTuning,
    /// Exit 0 once nothing is pending or leased
    #[arg(long, env = "TXOUTBOX_DRAIN")]
    pub drain: bool,
    #[command(flatten)]
    pub ops: OpsArgs,
}

/// The admin listener (metrics, health, API, dashboard) and the retention purge.
#[derive(Debug, Args, Clone)]
pub struct OpsArgs {
    /// Address of the admin listener (metrics, health, API, dashboard), or `off`
    /// [default: 127.0.0.1:8720, skipped with a warning when that port is taken]. A
    /// non-loopback address needs --admin-token
    #[arg(long, help_heading = "Admin", env = "TXOUTBOX_ADMIN_ADDR")]
    pub admin_addr: Option<String>,
    /// Bearer token for the admin API's mutating calls (retry, discard), and for every
    /// /api/ call when --admin-addr is not a loopback address
    #[arg(
        long,
        help_heading = "Admin",
        env = "TXOUTBOX_ADMIN_TOKEN",
        hide_env_values = true
    )]
    pub admin_token: Option<String>,
    /// File holding the admin token; a trailing newline is ignored. Instead of
    /// --admin-token
    #[arg(
        long,
        help_heading = "Admin",
        env = "TXOUTBOX_ADMIN_TOKEN_FILE",
        value_name = "PATH",
        conflicts_with = "admin_token"
    )]
    pub admin_token_file: Option<std::path::PathBuf>,
    /// How often the database-backed gauges (pending, leased, dead, oldest), the
    /// dashboard's history and the counts of /api/v1/status are refreshed, and, while events
    /// wait, how often the relay logs its progress (100ms to 1h)
    #[arg(long, help_heading = "Admin", env = "TXOUTBOX_METRICS_INTERVAL", default_value = "5s", value_parser = within(DurationRange::METRICS_INTERVAL))]
    pub metrics_interval: Duration,
    /// How often the retention purge looks for published events older than --retention-period
    /// (100ms to 1d)
    #[arg(long, help_heading = "Retention", env = "TXOUTBOX_RETENTION_INTERVAL", default_value = DEFAULTS.retention_interval.as_str(), value_parser = within(DurationRange::RETENTION_INTERVAL))]
    pub retention_interval: Duration,
    /// Rows deleted per purge statement
    #[arg(long, help_heading = "Retention", env = "TXOUTBOX_RETENTION_BATCH", default_value_t = DEFAULTS.purger.batch, value_parser = clap::value_parser!(i64).range(1..=1_000_000))]
    pub retention_batch: i64,
}

/// Relay settings shared by `relay` and `demo`.
#[derive(Debug, Args, Clone)]
pub struct RelayTuning {
    /// Events claimed per batch (1 to 100000)
    #[arg(long, help_heading = "Tuning", env = "TXOUTBOX_BATCH_SIZE", default_value_t = DEFAULTS.relay.batch_size, value_parser = count::<usize>(1, 100_000))]
    pub batch_size: usize,
    /// Messages awaiting broker acknowledgement at once, at most (1 to 1000000)
    #[arg(long, help_heading = "Tuning", env = "TXOUTBOX_MAX_IN_FLIGHT", default_value_t = DEFAULTS.relay.max_in_flight, value_parser = count::<usize>(1, 1_000_000))]
    pub max_in_flight: usize,
    /// Payload bytes one batch claims, at most: a batch stops before the event that would
    /// pass it, and an event larger goes alone (e.g. 16MiB, 512KiB; 1KiB to 4GiB)
    #[arg(long, help_heading = "Tuning", env = "TXOUTBOX_MAX_BATCH_BYTES", default_value = "16MiB", value_parser = parse_bytes)]
    pub max_batch_bytes: u64,
    /// Payload bytes of the batches in flight, at most: no batch is claimed while those in
    /// flight hold this much. With --max-event-bytes it bounds the relay's memory, whatever
    /// the rows hold (1KiB to 4GiB, at least --max-batch-bytes)
    #[arg(long, help_heading = "Tuning", env = "TXOUTBOX_MAX_IN_FLIGHT_BYTES", default_value = "64MiB", value_parser = parse_bytes)]
    pub max_in_flight_bytes: u64,
    /// An event whose payload is larger is never read: it is dead-lettered at once, its size
    /// in the error. Raise it for a broker that takes more (1KiB to 4GiB)
    #[arg(long, help_heading = "Tuning", env = "TXOUTBOX_MAX_EVENT_BYTES", default_value = "64MiB", value_parser = parse_bytes)]
    pub max_event_bytes: u64,
    /// Fallback poll when no wake-up arrives (e.g. 500ms, 5s; 10ms to 1h)
    #[arg(long, help_heading = "Tuning", env = "TXOUTBOX_POLL_INTERVAL", default_value = DEFAULTS.poll_interval.as_str(), value_parser = within(DurationRange::POLL_INTERVAL))]
    pub poll_interval: Duration,
    /// How long a claim's row lease holds its events; a dead relay's events return after this
    /// (1s to 1d). On PostgreSQL a relay holds its claims by partition (--partition-lease)
    /// instead, and leases rows only while it owns no partition
    #[arg(long, help_heading = "Tuning", env = "TXOUTBOX_LEASE", default_value = DEFAULTS.lease.as_str(), value_parser = within(DurationRange::LEASE))]
    pub lease: Duration,
    /// Failed attempts before an event is dead-lettered (1 to 1000000)
    #[arg(long, help_heading = "Retries and ordering", env = "TXOUTBOX_MAX_ATTEMPTS", default_value_t = DEFAULTS.relay.max_attempts, value_parser = count::<u32>(1, 1_000_000))]
    pub max_attempts: u32,
    /// First retry delay (doubles per attempt, with jitter; 1ms to 1d)
    #[arg(long, help_heading = "Retries and ordering", env = "TXOUTBOX_BACKOFF_BASE", default_value = DEFAULTS.backoff_base.as_str(), value_parser = within(DurationRange::BACKOFF))]
    pub backoff_base: Duration,
    /// Longest retry delay (1ms to 1d)
    #[arg(long, help_heading = "Retries and ordering", env = "TXOUTBOX_BACKOFF_MAX", default_value = DEFAULTS.backoff_max.as_str(), value_parser = within(DurationRange::BACKOFF))]
    pub backoff_max: Duration,
    /// On shutdown, how long to wait for in-flight acknowledgements (0s to 1h)
    #[arg(long, help_heading = "Tuning", env = "TXOUTBOX_SHUTDOWN_TIMEOUT", default_value = DEFAULTS.shutdown_timeout.as_str(), value_parser = within(DurationRange::SHUTDOWN_TIMEOUT))]
    pub shutdown_timeout: Duration,
    /// Keep published events this long (e.g. 7d, 12h), then delete them in batches;
    /// 0 deletes each event as soon as it is published (at most 36500d). Dead letters are
    /// always kept
    /// [default: 7d; 0 with --source wal, whose drain an UPDATE per kept row slows: docs/wal.md]
    #[arg(long, help_heading = "Retention", env = "TXOUTBOX_RETENTION_PERIOD", value_name = "RETENTION_PERIOD", value_parser = within(DurationRange::RETENTION_PERIOD))]
    pub retention_period: Option<Duration>,
    /// This relay's name in locked_by (default host:pid:random)
    #[arg(long, help_heading = "Tuning", env = "TXOUTBOX_RELAY_ID")]
    pub relay_id: Option<String>,
    /// Whether each aggregate's events keep their order, also with many relays (they share the
    /// aggregate-hash partitions). All relays of one table must use the same mode
    #[arg(long, help_heading = "Retries and ordering", env = "TXOUTBOX_MODE", value_enum, default_value_t = DEFAULTS.relay.mode())]
    pub mode: Mode,
    /// Ordered mode: what becomes of an aggregate's later events when one of its events is
    /// dead-lettered
    #[arg(
        long,
        help_heading = "Retries and ordering",
        env = "TXOUTBOX_ON_DEAD_LETTER",
        value_enum,
        default_value_t = DEFAULTS.relay.on_dead_letter()
    )]
    pub on_dead_letter: OnDeadLetter,
    /// How long a relay's partitions last without its heartbeat: a dead relay's share is
    /// taken over after this (2s to 1h)
    #[arg(long, help_heading = "Retries and ordering", env = "TXOUTBOX_PARTITION_LEASE", default_value = DEFAULTS.partition_lease.as_str(), value_parser = within(DurationRange::PARTITION_LEASE))]
    pub partition_lease: Duration,
    /// Batches being published at once: the next batch is claimed while earlier ones are
    /// published and settled, and (PostgreSQL) as many more may be settling
    /// (per-aggregate order is kept either way; 1 to 64)
    #[arg(long, help_heading = "Tuning", env = "TXOUTBOX_PIPELINE", default_value_t = DEFAULTS.relay.pipeline, value_parser = count::<usize>(1, 64))]
    pub pipeline: usize,
    /// For tests and failure drills: make this fraction (0 to 1) of publishes fail
    /// transiently, half before sending, half by losing the broker's acknowledgement
    #[arg(long, help_heading = "Testing", env = "TXOUTBOX_INJECT_FAULTS", default_value_t = 0.0, value_parser = parse_fraction)]
    pub inject_faults: f64,
}

impl RelayTuning {
    /// `--retention-period` as given, else the default of the relay's `source`
    /// ([`Purger::default_keep`]: 7d for the table, 0 for the WAL source).
    pub fn retention_period(&self, source: Source) -> Duration {
        self.retention_period
            .unwrap_or_else(|| Purger::default_keep(source))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory, FromArgMatches};

    #[test]
    fn cli_is_consistent() {
        Cli::command().debug_assert();
    }

    /// `txoutbox relay ARGS`, without the environment's TXOUTBOX_* values (which would win
    /// over the defaults).
    fn relay(args: &[&str]) -> RelayArgs {
        let cmd = Cli::command().mut_subcommand("relay", |s| s.mut_args(|a| a.env(None)));
        let m = cmd
            .try_get_matches_from(["txoutbox", "relay"].iter().chain(args))
            .unwrap();
        let Command::Relay(r) = Cli::from_arg_matches(&m).unwrap().command else {
            panic!("not the relay command")
        };
        r
    }

    /// Every setting a flag has comes out of a flagless command line as the library's
    /// default (the relay id aside: each process makes its own).
    #[test]
    fn flag_defaults_are_the_library_defaults() {
        let r = relay(&[]);
        let mut got = crate::cmd::relay_config(&r.tuning, false).unwrap();
        let want = RelayConfig::default();
        got.relay_id.clone_from(&want.relay_id);
        assert_eq!(format!("{got:?}"), format!("{want:?}"));
        assert_eq!(r.source, want.source, "--source");
        assert_eq!(r.slot, want.slot, "--slot");
        let purger = Purger::default();
        assert_eq!(r.tuning.retention_period(Source::Table), purger.keep);
        assert_eq!(r.ops.retention_interval, purger.every);
        assert_eq!(r.ops.retention_batch, purger.batch);
        let table = OutboxTable::default();
        let m = Cli::command()
            .mut_args(|a| a.env(None))
            .try_get_matches_from(["txoutbox", "status"])
            .unwrap();
        let g = Cli::from_arg_matches(&m).unwrap().global;
        assert_eq!(
            OutboxTable::new(&g.schema, &g.table).unwrap(),
            table,
            "--schema/--table"
        );
    }

    /// Published rows stay 7 days with the table relay and go on settle with the WAL source,
    /// unless --retention-period says otherwise, for either; and the store follows.
    #[test]
    fn retention_defaults_to_the_source_and_a_given_period_wins() {
        use crate::cmd::retention;
        use txoutbox::store::Retention;
        let week = Duration::from_secs(7 * 24 * 3600);
        let r = relay(&[]);
        assert_eq!(r.tuning.retention_period(Source::Table), week);
        assert_eq!(
            retention(r.tuning.retention_period(Source::Table)),
            Retention::Mark
        );
        assert_eq!(r.tuning.retention_period(Source::Wal), Duration::ZERO);
        assert_eq!(
            retention(r.tuning.retention_period(Source::Wal)),
            Retention::Delete
        );
        let r = relay(&["--retention-period", "2h"]);
        for source in [Source::Table, Source::Wal] {
            assert_eq!(r.tuning.retention_period(source), Duration::from_secs(7200));
            assert_eq!(
                retention(r.tuning.retention_period(source)),
                Retention::Mark
            );
        }
        let r = relay(&["--retention-period", "0"]);
        assert_eq!(
            retention(r.tuning.retention_period(Source::Table)),
            Retention::Delete
        );
    }

    /// What the library refuses, the daemon refuses, in its flags' words.
    #[test]
    fn library_refusals_name_the_flags() {
        let cases: &[(&[&str], &str)] = &[
            (&["--relay-id", ""], "--relay-id must not be empty"),
            (
                &["--backoff-base", "2m"],
                "--backoff-base must not exceed --backoff-max",
            ),
            (
                &["--mode", "unordered", "--on-dead-letter", "hold"],
                "--on-dead-letter hold needs --mode ordered",
            ),
        ];
        for (args, want) in cases {
            let e = crate::cmd::relay_config(&relay(args).tuning, false).unwrap_err();
            assert!(e.to_string().starts_with(want), "{args:?}: {e}");
        }
        let held = relay(&["--on-dead-letter", "hold"]);
        let c = crate::cmd::relay_config(&held.tuning, false).unwrap();
        assert_eq!(c.ordering, txoutbox::store::Ordering::OrderedHold);
    }
}
