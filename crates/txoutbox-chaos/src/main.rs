//! `txoutbox-chaos`: a workload, fault injector and checker for the txoutbox relay.
//!
//! It starts its own PostgreSQL cluster and broker (a NATS server, or a RabbitMQ node with
//! `--publisher amqp`; so restarting them disturbs nobody; with the `failover` fault a
//! primary and a standby), puts a fault-injecting proxy in
//! front of each for every relay, runs writers that commit
//! (and roll back) events, runs real `txoutbox relay` processes (claiming rows, or with
//! `--source wal` reading the outbox's replication slot), injects faults at seeded
//! random moments, lets the relays drain, reads everything the broker holds, and checks:
//! nothing lost, nothing phantom, per-aggregate order of first deliveries, dead letters only
//! where meant, and no relay sending an event outside a lease it held.
//!
//! It ends with one line, `lost=N phantom=N duplicates=N order_violations=N faults=N`, and
//! exits 1 when an invariant broke (2 on bad flags).

mod amqp_consumer;
mod amqp_tap;
mod audit;
mod basebackup;
mod broker;
mod check;
mod cluster;
mod failover;
mod faults;
mod finish;
mod proxy;
mod rabbit;
mod relays;
mod run;
mod slot;
mod workload;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;

/// Fault-injection run against real txoutbox relays: proves nothing is lost.
#[derive(Debug, Parser)]
#[command(
    version,
    about,
    long_about = None,
    args_override_self = true,
    after_help = "Ends with one line, lost=N phantom=N duplicates=N order_violations=N faults=N, and exits 1 when an invariant broke (2 on bad flags)."
)]
pub struct Args {
    /// How long the writers write and faults are injected (then the relays drain).
    #[arg(long, default_value = "60s", value_parser = txoutbox::relay::parse_duration)]
    pub duration: Duration,
    /// Relay processes at once.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u16).range(1..=32))]
    pub relays: u16,
    /// The broker, run privately for the run: `nats` (a nats-server with JetStream; the
    /// checker reads the stream) or `amqp` (a RabbitMQ node; a consumer reads a durable
    /// queue during the run, reconnecting through broker restarts).
    #[arg(long, default_value = "nats", value_parser = ["nats", "amqp"])]
    pub publisher: String,
    /// Seed of every random choice: the fault schedule and the workload.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Where the relays find committed events: `table` (claiming rows) or `wal` (the outbox's
    /// logical replication slot; the run's PostgreSQL then starts with `wal_level=logical`).
    #[arg(long, default_value = "table", value_parser = ["table", "wal"])]
    pub source: String,
    /// The relays' mode; order is checked in `ordered` only.
    #[arg(long, default_value = "ordered", value_parser = ["ordered", "unordered"])]
    pub mode: String,
    /// Faults to inject: a comma-separated list of kill, stop, cut, stall, slow, reset,
    /// pg-restart, broker-restart, publisher, failover, and with `--source wal` slot-loss; or
    /// `all` (slot-loss included with `--source wal`), or `none`. With failover the run's
    /// PostgreSQL is a primary and a synchronous physical standby: the fault kills the
    /// primary and promotes the standby, and a new standby is made of the old node (another
    /// failover waits until it is ready).
    #[arg(long, default_value = "all")]
    pub faults: String,
    /// Mean time between two faults (each gap is drawn from 0.5x to 1.5x of it).
    #[arg(long, default_value = "6s", value_parser = txoutbox::relay::parse_duration)]
    pub fault_interval: Duration,
    /// With the `publisher` fault: the fraction of publishes that fail transiently.
    #[arg(long, default_value_t = 0.02)]
    pub publisher_fault_rate: f64,
    /// Writer tasks; each owns its aggregates, so their commit order is their seq order.
    #[arg(long, default_value_t = 4)]
    pub writers: usize,
    /// Aggregates, spread over the writers.
    #[arg(long, default_value_t = 200)]
    pub aggregates: usize,
    /// Events per second, all writers together.
    #[arg(long, default_value_t = 300.0)]
    pub rate: f64,
    /// Most events in one transaction.
    #[arg(long, default_value_t = 40)]
    pub max_events: usize,
    /// Fraction of transactions rolled back.
    #[arg(long, default_value_t = 0.1)]
    pub rollback_ratio: f64,
    /// Fraction of events that are poison (an event type no publisher takes): dead-lettered,
    /// nothing else.
    #[arg(long, default_value_t = 0.002)]
    pub poison_ratio: f64,
    /// The relays' --lease.
    #[arg(long, default_value = "5s", value_parser = txoutbox::relay::parse_duration)]
    pub lease: Duration,
    /// The relays' --partition-lease.
    #[arg(long, default_value = "3s", value_parser = txoutbox::relay::parse_duration)]
    pub partition_lease: Duration,
    /// How long the relays may take to drain after the last fault.
    #[arg(long, default_value = "180s", value_parser = txoutbox::relay::parse_duration)]
    pub drain_timeout: Duration,
    /// The `txoutbox` binary (default: the one next to this binary).
    #[arg(long)]
    pub txoutbox_bin: Option<PathBuf>,
    /// Directory with PostgreSQL's initdb and pg_ctl.
    #[arg(long, default_value = "/usr/lib/postgresql/15/bin")]
    pub pg_bin: PathBuf,
    /// The nats-server binary.
    #[arg(long, default_value = "/usr/sbin/nats-server")]
    pub nats_server: PathBuf,
    /// With `--publisher amqp`: the rabbitmq-server script (rabbitmqctl is taken from the same
    /// directory). Debian's /usr/sbin wrapper would switch to the rabbitmq user, who cannot
    /// write to the run's directory: hence the script itself.
    #[arg(long, default_value = "/usr/lib/rabbitmq/bin/rabbitmq-server")]
    pub rabbitmq_server: PathBuf,
    /// Keep the run directory (databases, logs) even when the run passes.
    #[arg(long)]
    pub keep: bool,
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    if !(0.0..=1.0).contains(&args.publisher_fault_rate)
        || !(0.0..=1.0).contains(&args.rollback_ratio)
        || !(0.0..=1.0).contains(&args.poison_ratio)
    {
        eprintln!("error: --publisher-fault-rate, --rollback-ratio and --poison-ratio are fractions in [0, 1]");
        return ExitCode::from(2);
    }
    if args.writers == 0 || args.aggregates < args.writers || args.rate <= 0.0 {
        eprintln!("error: need --writers >= 1, --aggregates >= --writers and --rate > 0");
        return ExitCode::from(2);
    }
    let kinds = match faults::parse_list(&args.faults, args.source == "wal") {
        Ok(k) => k,
        Err(e) => {
            eprintln!("error: --faults: {e}");
            return ExitCode::from(2);
        }
    };
    let result = tokio::select! {
        r = run::run(args, kinds) => r,
        _ = tokio::signal::ctrl_c() => {
            // Dropping the run stops the relays, the broker and PostgreSQL it started.
            eprintln!("chaos: interrupted; stopping what this run started");
            return ExitCode::from(130);
        }
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
