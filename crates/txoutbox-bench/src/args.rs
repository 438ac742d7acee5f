//! `txoutbox-bench` options.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, ValueEnum};
use txoutbox::relay::{parse_duration, Mode, RelayConfig, Source};

/// Measure the outbox on this PostgreSQL: drain rate, commit-to-ack latency, write-path cost
/// and scaling with relays. Every run gets a fresh schema (txo_bench_<pid>_<n>), migrated,
/// and dropped afterwards; relays run as child processes (`txoutbox relay`).
#[derive(Debug, Parser)]
#[command(name = "txoutbox-bench", version, max_term_width = 100)]
pub struct BenchArgs {
    /// publish: each publisher alone, no database (messages/s: the broker's ceiling through
    /// txoutbox's client); drain: N pre-inserted events drained by one relay (events/s, peak
    /// RSS); latency: writers commit at a fixed rate while a relay runs (commit-to-ack
    /// p50/p90/p99/max); write: commits/s of a business transaction with and without the
    /// outbox; scale: drain rate with 1, 2, 4 relays, ordered and unordered; all: the five in
    /// turn
    #[arg(value_enum)]
    pub scenario: Scenario,
    /// The PostgreSQL to measure on (postgres://user@127.0.0.1:5432/app): each run makes its
    /// own schema in it
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: String,
    /// The `txoutbox` binary that runs the relays [default: the one next to this binary,
    /// else `txoutbox` on PATH]
    #[arg(long, env = "TXOUTBOX_BIN", value_name = "PATH")]
    pub txoutbox_bin: Option<PathBuf>,
    /// drain, scale: also run every configuration with this other `txoutbox` (an older build:
    /// scripts/bench-compare.sh builds one from a git revision), interleaved with the runs of
    /// --txoutbox-bin, and add each row's ratio to it. Each run's schema is then migrated by
    /// the binary that runs it (`txoutbox migrate`), so a build runs on the schema it knows
    #[arg(long, env = "TXOUTBOX_BENCH_BASELINE_BIN", value_name = "PATH")]
    pub baseline_bin: Option<PathBuf>,
    /// Publisher URL for the relays; repeat it to compare publishers in drain (latency, write
    /// and scale use the first). null: acknowledges at once: the database side alone.
    /// routes:PATH runs the relays with the `[[route]]` entries of the config file PATH
    /// (see --event-types to spread events over routes). For publish only,
    /// async-nats:nats://HOST:PORT?stream=NAME&subject=PREFIX sends the same messages with
    /// async-nats alone, the reference for txoutbox's NATS publisher. drain and scale empty a
    /// nats:// publisher's stream before each run if the bench made it (it was missing when
    /// the bench started); a stream that was there before is left alone
    #[arg(
        long = "publisher",
        value_name = "URL",
        env = "TXOUTBOX_BENCH_PUBLISHER",
        default_value = "null:",
        hide_env_values = true
    )]
    pub publishers: Vec<String>,
    /// drain, scale: events pre-inserted per run (publish: messages sent)
    #[arg(long, env = "TXOUTBOX_BENCH_EVENTS", default_value_t = 100_000, value_parser = clap::value_parser!(u64).range(1..=100_000_000))]
    pub events: u64,
    /// drain, scale: distinct aggregates the events are spread over
    #[arg(long, env = "TXOUTBOX_BENCH_AGGREGATES", default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..=100_000_000))]
    pub aggregates: u64,
    /// drain: event types the events are spread over, round robin: `order.created` when 1,
    /// else `order.e0` ... (for routes by event type)
    #[arg(long, env = "TXOUTBOX_BENCH_EVENT_TYPES", default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=1000))]
    pub event_types: u64,
    /// drain, scale: each event's JSON payload, in bytes as stored, about: its `note` field is
    /// this less 100 characters (the default gives the ~200-byte payloads of every figure in
    /// docs/performance.md; larger ones take a claim through the byte budget's full statement
    /// once they pass `--max-batch-bytes / --batch-size`)
    #[arg(long, env = "TXOUTBOX_BENCH_PAYLOAD_BYTES", default_value_t = 200, value_parser = clap::value_parser!(u64).range(100..=16_000_000))]
    pub payload_bytes: u64,
    /// latency: total commit rates to test, events/s (comma-separated or repeated)
    #[arg(long = "rate", value_name = "N", env = "TXOUTBOX_BENCH_RATE", value_delimiter = ',', default_values_t = [500u32, 5000], value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub rates: Vec<u32>,
    /// latency, write: how long writers run per run
    #[arg(long, env = "TXOUTBOX_BENCH_DURATION", default_value = "10s", value_parser = parse_duration)]
    pub duration: Duration,
    /// latency: after writers stop, how long the relay may take to catch up and still count
    /// as keeping up (events that arrive later still count as delivered)
    #[arg(long, env = "TXOUTBOX_BENCH_GRACE", default_value = "5s", value_parser = parse_duration)]
    pub grace: Duration,
    /// latency, write: concurrent writer connections
    #[arg(long, env = "TXOUTBOX_BENCH_WRITERS", default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub writers: u32,
    /// scale: relay counts to compare (comma-separated or repeated)
    #[arg(long = "relays", value_name = "N", env = "TXOUTBOX_BENCH_RELAYS", value_delimiter = ',', default_values_t = [1u32, 2, 4], value_parser = clap::value_parser!(u32).range(1..=64))]
    pub relays: Vec<u32>,
    /// Relay mode(s): drain, latency and write use the first (default: the relay's, ordered);
    /// scale compares all given (default ordered,unordered)
    #[arg(
        long = "mode",
        value_name = "MODE",
        env = "TXOUTBOX_BENCH_MODE",
        value_delimiter = ',',
        value_enum
    )]
    pub modes: Vec<Mode>,
    /// Where the relays read events from: table (claim rows), wal (PostgreSQL's logical
    /// replication stream, `relay --source wal`), or both to compare them (table,wal): drain,
    /// latency, write and scale run every configuration once per source, interleaved, and
    /// add each one's ratio to table. A wal run creates its schema's publication and slot
    /// before inserting anything and drops them with the schema
    #[arg(
        long = "source",
        value_name = "SOURCE",
        env = "TXOUTBOX_BENCH_SOURCE",
        value_delimiter = ',',
        default_values_t = [Source::Table],
        value_enum
    )]
    pub sources: Vec<Source>,
    /// drain: with wal among --source, also drain events written tableless (each a
    /// transactional logical message through the migration's `<table>_emit_event`, no row), in
    /// the same transactions of 1,000 as the table's: the row's source reads
    /// `tableless`, and its ratio to table compares it with the table source
    #[arg(long)]
    pub tableless: bool,
    /// Runs per configuration; configurations are interleaved (A B C A B C ...) and the
    /// median, min and max are reported
    #[arg(long, env = "TXOUTBOX_BENCH_REPEATS", default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub repeats: u32,
    /// Extra option for every relay child, e.g. --relay-arg=--retention-period=0 (the
    /// children of both sources keep published rows 7 days unless told otherwise, though
    /// the WAL source's own default deletes them) or --relay-arg=--batch-size=1000 (repeatable)
    #[arg(long = "relay-arg", value_name = "ARG", allow_hyphen_values = true)]
    pub relay_args: Vec<String>,
    /// drain, scale: also count what each run costs the database, the same on a busy machine:
    /// bytes and round trips between the relays and PostgreSQL (through a counting proxy in
    /// this process) and WAL written, per event. The WAL is the whole server's: run nothing
    /// else on it meanwhile
    #[arg(long)]
    pub costs: bool,
    /// drain, scale: count the costs (as --costs) and print, after each run, every distinct
    /// statement the relays ran (the start of its text) and how many times, to stderr
    #[arg(long)]
    pub statements: bool,
    /// drain, scale: with --costs, fail (exit 1, one line per count) if a configuration's
    /// count is more than the file's threshold over the count stored for it there; the
    /// regression gate CI runs (docs/bench/costs.json)
    #[arg(long, value_name = "PATH")]
    pub check_costs: Option<PathBuf>,
    /// drain, scale: with --costs, write the counts of this run to PATH as the baseline for
    /// --check-costs (threshold: that of the --check-costs file, else that of the file PATH
    /// replaces, else 10%)
    #[arg(long, value_name = "PATH")]
    pub write_costs: Option<PathBuf>,
    /// Print one JSON document on stdout instead of the table (no progress bar)
    #[arg(long)]
    pub json: bool,
    /// Also write the JSON document to this file (the table still goes to stdout)
    #[arg(long, value_name = "PATH")]
    pub json_file: Option<PathBuf>,
    /// Also write an SVG chart of throughput and latency percentiles to this file
    #[arg(long, value_name = "PATH")]
    pub chart: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Scenario {
    Publish,
    Drain,
    Latency,
    Write,
    Scale,
    All,
}

impl BenchArgs {
    /// The mode for scenarios that run one (default: the relay's).
    pub fn mode(&self) -> Mode {
        self.modes
            .first()
            .copied()
            .unwrap_or_else(|| RelayConfig::default().mode())
    }

    /// The sources to compare, each once, in the order given.
    pub fn sources(&self) -> Vec<Source> {
        let mut out: Vec<Source> = Vec::new();
        for s in &self.sources {
            if !out.contains(s) {
                out.push(*s);
            }
        }
        out
    }

    /// Are the costs counted? (`--costs`, or a file to check them against or write them to.)
    pub fn costs(&self) -> bool {
        self.costs || self.statements || self.check_costs.is_some() || self.write_costs.is_some()
    }

    /// The modes `scale` compares.
    pub fn scale_modes(&self) -> Vec<Mode> {
        if self.modes.is_empty() {
            vec![Mode::Ordered, Mode::Unordered]
        } else {
            self.modes.clone()
        }
    }
}
