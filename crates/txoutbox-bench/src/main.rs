//! `txoutbox-bench`: drain rate, commit-to-ack latency, write-path cost and scaling, measured
//! on the PostgreSQL of --database-url with the relay as a real child process (`txoutbox
//! relay`, found with [`child::find_txoutbox`]).
//!
//! ```text
//! cargo build --release -p txoutbox-cli -p txoutbox-bench
//! target/release/txoutbox-bench drain --database-url postgres://postgres@127.0.0.1:5432/test
//! ```

mod args;
mod chart;
mod child;
mod cost;
mod drain;
mod latency;
mod publish;
mod report;
mod schema;
mod write;

use std::future::Future;
use std::path::PathBuf;
use std::process::ExitCode;
use std::str::FromStr;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use indicatif::{ProgressBar, ProgressStyle};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, Connection, PgPool};
use txoutbox::publish::{ConnectError, Publisher};
use txoutbox::redact::{redact_secrets, redact_url};
use txoutbox::relay::{Mode, Source};

use args::{BenchArgs, Scenario};
use drain::DrainConfig;
use latency::LatencyConfig;
use report::{Report, Row, RunResult, Section};
use schema::{BenchDb, Registry};

/// A bad flag or URL: one line, exit code 2 (as clap's own usage errors).
#[derive(Debug)]
struct UsageError(String);

impl std::fmt::Display for UsageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

fn main() -> ExitCode {
    let args = BenchArgs::parse(); // usage errors exit 2, --help/--version 0
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(args)) {
        Ok(code) => code,
        Err(e) => {
            // Whatever an error quotes (a URL, a client library's echo of its settings), no
            // secret reaches the terminal.
            eprintln!("error: {}", redact_secrets(&format!("{e:#}")));
            if e.downcast_ref::<UsageError>().is_some() {
                ExitCode::from(2)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}

/// What every run needs.
pub struct Env {
    pub pool: PgPool,
    /// The `txoutbox` binary that runs the relays.
    pub txoutbox: PathBuf,
    /// Another build to compare with (`--baseline-bin`); then each run's schema is migrated by
    /// the binary that runs it.
    pub baseline: Option<PathBuf>,
    pub database_url: String,
    pub registry: Registry,
    pub publishers: Vec<String>,
    pub events: u64,
    pub aggregates: u64,
    pub event_types: u64,
    /// Each pre-inserted payload's size, about (`--payload-bytes`).
    pub payload_bytes: u64,
    pub duration: Duration,
    pub grace: Duration,
    pub writers: u32,
    pub mode: Mode,
    pub relay_args: Vec<String>,
    /// Count bytes, statements and WAL per event (`--costs`).
    pub costs: bool,
    /// Print each run's statements (`--statements`).
    pub statements: bool,
    bar: ProgressBar,
}

impl Env {
    /// How the pre-inserted events are spread, and their payloads' size.
    pub fn shape(&self) -> schema::Shape {
        schema::Shape {
            aggregates: self.aggregates,
            event_types: self.event_types,
            payload_bytes: self.payload_bytes,
        }
    }

    /// What is running now, beside the progress bar.
    pub fn status(&self, msg: &str) {
        self.bar.set_message(msg.to_string());
    }
}

async fn run(a: BenchArgs) -> anyhow::Result<ExitCode> {
    let url = a.database_url.clone();
    let postgres_url = url.starts_with("postgres://") || url.starts_with("postgresql://");
    if !postgres_url && a.sources().contains(&Source::Wal) {
        return Err(UsageError(
            "--source wal needs PostgreSQL (a postgres:// URL): the WAL source reads its \
             logical replication stream; MySQL and SQLite have the table source only"
                .into(),
        )
        .into());
    }
    if a.tableless && !a.sources().contains(&Source::Wal) {
        return Err(UsageError(
            "--tableless needs wal among --source (e.g. --source table,wal): only the WAL \
             source delivers tableless events"
                .into(),
        )
        .into());
    }
    if !postgres_url {
        return Err(UsageError(
            "txoutbox-bench measures PostgreSQL only (a postgres:// URL); for MySQL and SQLite \
             use scripts/drain-db.sh"
                .into(),
        )
        .into());
    }
    // Malformed publisher URLs are usage errors, before anything is created. A routes file is
    // the relays' to check (they say what is wrong with it); here only that it can be read.
    for p in &a.publishers {
        if let Some(path) = p.strip_prefix(child::ROUTES_PREFIX) {
            if a.scenario == Scenario::Publish || a.scenario == Scenario::All {
                return Err(UsageError(format!(
                    "--publisher {p}: publish measures one publisher alone; routes are for the \
                     relay scenarios (drain, latency, write, scale)"
                ))
                .into());
            }
            std::fs::metadata(path)
                .map_err(|e| UsageError(format!("--publisher {p}: cannot read {path}: {e}")))?;
            continue;
        }
        if let Some(nats) = p.strip_prefix(publish::ASYNC_NATS_PREFIX) {
            if a.scenario != Scenario::Publish {
                return Err(UsageError(format!(
                    "--publisher {p}: async-nats alone is a reference for the publish scenario \
                     only"
                ))
                .into());
            }
            publish::async_nats_target(nats)
                .map_err(|e| UsageError(format!("--publisher {p}: {e:#}")))?;
            continue;
        }
        // Before the connection below creates a missing NATS stream: was it there?
        drain::meet_stream(p).await;
        let publisher = open_publisher(p).await?;
        let _ = publisher.close().await;
    }
    let txoutbox = child::find_txoutbox(a.txoutbox_bin.as_deref())?;
    let baseline = match &a.baseline_bin {
        Some(p) if !p.is_file() => {
            return Err(UsageError(format!("--baseline-bin {}: no such file", p.display())).into())
        }
        Some(p) if !matches!(a.scenario, Scenario::Drain | Scenario::Scale) => {
            return Err(UsageError(format!(
                "--baseline-bin {}: drain and scale compare builds; {} does not",
                p.display(),
                format!("{:?}", a.scenario).to_lowercase()
            ))
            .into())
        }
        other => other.clone(),
    };
    if a.costs() && !matches!(a.scenario, Scenario::Drain | Scenario::Scale) {
        return Err(UsageError(format!(
            "--costs, --statements, --check-costs and --write-costs count what a drain costs: drain and \
             scale only, not {}",
            format!("{:?}", a.scenario).to_lowercase()
        ))
        .into());
    }
    // The baseline is read before anything runs: a missing or malformed file is the first
    // thing said, not the last.
    let cost_baseline = match &a.check_costs {
        Some(path) => Some(cost::Baseline::read(path).map_err(|e| UsageError(format!("{e:#}")))?),
        None => None,
    };
    let (pool, postgres) = bench_pool(&url, a.writers + 4).await?;
    if a.sources().contains(&Source::Wal) && a.scenario != Scenario::Publish {
        // Before any schema is made: the line that names the fix, not a failed relay's log.
        txoutbox::store::postgres::wal::check_wal_level(&pool)
            .await
            .context("--source wal")?;
    }
    let bar = if a.json {
        ProgressBar::hidden()
    } else {
        // indicatif draws nothing when stderr is not a terminal.
        ProgressBar::new(0)
    };
    bar.set_style(
        ProgressStyle::with_template("{elapsed_precise} [{bar:25}] {pos}/{len} runs  {wide_msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    let env = Env {
        pool: pool.clone(),
        txoutbox,
        baseline,
        database_url: url,
        registry: Registry::default(),
        publishers: a.publishers.clone(),
        events: a.events,
        aggregates: a.aggregates,
        event_types: a.event_types,
        payload_bytes: a.payload_bytes,
        duration: a.duration,
        grace: a.grace,
        writers: a.writers,
        mode: a.mode(),
        relay_args: a.relay_args.clone(),
        costs: a.costs(),
        statements: a.statements,
        bar: bar.clone(),
    };
    let started_at = chrono::Utc::now();
    let outcome = tokio::select! {
        r = scenarios(&env, &a) => r.map(Some),
        _ = interrupted() => Ok(None),
    };
    bar.finish_and_clear();
    // Relay children were killed on drop; now their schemas go too.
    let left = env.registry.drop_all(&pool).await;
    if !left.is_empty() {
        eprintln!(
            "warning: could not drop the bench schema(s) {}; drop them by hand, with their \
             replication slots (SELECT pg_drop_replication_slot(slot_name) FROM \
             pg_replication_slots WHERE slot_name LIKE 'txoutbox_%_txo_bench_{}_%'), which \
             otherwise keep the server's WAL",
            left.join(", "),
            std::process::id()
        );
    }
    let Some(sections) = outcome? else {
        eprintln!("interrupted: bench schemas dropped");
        return Ok(ExitCode::from(130));
    };
    let report = Report {
        txoutbox_version: env!("CARGO_PKG_VERSION"),
        started_at,
        postgres: format!("PostgreSQL {postgres}"),
        cpus: std::thread::available_parallelism().map_or(0, |n| n.get()),
        repeats: a.repeats,
        sections,
    };
    if a.json {
        println!("{}", report.json()?);
    } else {
        print!("{}", report.table());
    }
    if let Some(path) = &a.json_file {
        std::fs::write(path, report.json()? + "\n")
            .with_context(|| format!("writing {}", path.display()))?;
    }
    let cost_rows: Vec<Row> = report
        .sections
        .iter()
        .filter(|s| s.scenario == "drain" || s.scenario == "scale")
        .flat_map(|s| s.rows.iter().cloned())
        .collect();
    if let Some(path) = &a.write_costs {
        // The threshold of the file checked against, else of the file rewritten.
        let threshold = cost_baseline
            .as_ref()
            .map(|b| b.threshold)
            .or_else(|| cost::Baseline::read(path).ok().map(|b| b.threshold))
            .unwrap_or(cost::DEFAULT_THRESHOLD);
        cost::Baseline::from_rows(&cost_rows, threshold).write(path)?;
    }
    if let Some(baseline) = &cost_baseline {
        let failures = baseline.check(&cost_rows);
        if !failures.is_empty() {
            for f in &failures {
                eprintln!("cost regression: {f}");
            }
            eprintln!(
                "error: {} count(s) over {} (if the change is worth it, write a new baseline \
                 with --write-costs and say why in the commit)",
                failures.len(),
                a.check_costs
                    .as_deref()
                    .map(|p| p.display().to_string())
                    .unwrap_or_default()
            );
            return Ok(ExitCode::FAILURE);
        }
    }
    if let Some(path) = &a.chart {
        chart::write(&report, path)?;
        if !a.json {
            println!("\nchart: {}", path.display());
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Is `publisher` a NATS publisher's URL (`nats://`, or `tls://` for NATS over TLS)?
pub fn is_nats(publisher: &str) -> bool {
    publisher.starts_with("nats://") || publisher.starts_with("tls://")
}

/// A publisher URL for a table row: redacted, without its query string (the JSON has it all).
pub fn short_url(url: &str) -> String {
    let u = txoutbox::redact::redact_url(url);
    match u.split_once('?') {
        Some((base, _)) => base.to_string(),
        None => u,
    }
}

/// SIGINT (Ctrl-C) or SIGTERM.
async fn interrupted() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}

/// A pool with the relay's connection settings, but without sqlx's "slow statement"
/// warnings (the bench's bulk inserts are slow on purpose), and the server's version. One
/// direct connection first, which asks for the version: a pool would report only "timed
/// out", not why it cannot connect.
async fn bench_pool(url: &str, max_connections: u32) -> anyhow::Result<(PgPool, String)> {
    let opts = PgConnectOptions::from_str(url)
        .map_err(|e| UsageError(format!("invalid database URL {}: {e}", redact_url(url))))?
        .disable_statement_logging();
    let opts = txoutbox::store::postgres::relay_connect_options(opts);
    let unreachable = || format!("cannot connect to PostgreSQL at {}", redact_url(url));
    let mut conn = tokio::time::timeout(Duration::from_secs(10), opts.connect())
        .await
        .map_err(|_| anyhow::anyhow!("no answer within 10s"))
        .with_context(unreachable)?
        .with_context(unreachable)?;
    let version: String = sqlx::query_scalar("SELECT current_setting('server_version')")
        .fetch_one(&mut conn)
        .await
        .context("asking PostgreSQL for its version")?;
    let _ = conn.close().await;
    let pool = PgPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(Duration::from_secs(30))
        .connect_lazy_with(opts);
    Ok((pool, version))
}

/// Open a publisher; a malformed URL is a usage error (exit 2), an unreachable broker not.
async fn open_publisher(url: &str) -> anyhow::Result<Box<dyn Publisher>> {
    txoutbox::publish::connect(url).await.map_err(|e| match e {
        ConnectError::Config(e) => UsageError(format!("--publisher: {e}")).into(),
        ConnectError::Publish(e) => anyhow::anyhow!(
            "cannot reach the broker at {}: {}",
            redact_url(url),
            e.chain()
        ),
    })
}

async fn scenarios(env: &Env, a: &BenchArgs) -> anyhow::Result<Vec<Section>> {
    let wanted = |s: Scenario| a.scenario == s || a.scenario == Scenario::All;
    // Each configuration once per source, side by side (table, wal, table, wal, ...), and with
    // --baseline-bin once per build, the two back to back.
    let sources = a.sources();
    let builds = drain::Build::all(env);
    let drains: Vec<DrainConfig> = a
        .publishers
        .iter()
        .flat_map(|p| {
            let sources = &sources;
            // With --tableless, a WAL source's configuration is run twice: rows, then
            // tableless events.
            let kinds = move |source: &Source| {
                let tableless = *source == Source::Wal && a.tableless;
                [false, true].into_iter().filter(move |t| !t || tableless)
            };
            sources.iter().flat_map(move |source| {
                kinds(source).flat_map(move |tableless| {
                    builds.iter().map(move |build| DrainConfig {
                        publisher: p.clone(),
                        relays: 1,
                        mode: a.mode(),
                        source: *source,
                        tableless,
                        build: *build,
                    })
                })
            })
        })
        .collect();
    let latencies: Vec<LatencyConfig> = a
        .rates
        .iter()
        .flat_map(|r| {
            sources.iter().map(|source| LatencyConfig {
                rate: *r,
                publisher: a.publishers[0].clone(),
                mode: a.mode(),
                source: *source,
            })
        })
        .collect();
    let scales: Vec<DrainConfig> = a
        .scale_modes()
        .into_iter()
        .flat_map(|mode| {
            let sources = &sources;
            a.relays.iter().flat_map(move |r| {
                sources.iter().flat_map(move |source| {
                    builds.iter().map(move |build| DrainConfig {
                        publisher: a.publishers[0].clone(),
                        relays: *r,
                        mode,
                        source: *source,
                        tableless: false,
                        build: *build,
                    })
                })
            })
        })
        .collect();
    let writes = write::configs(&sources);
    let mut runs = 0;
    for (s, n) in [
        (Scenario::Publish, a.publishers.len()),
        (Scenario::Drain, drains.len()),
        (Scenario::Latency, latencies.len()),
        (Scenario::Write, writes.len()),
        (Scenario::Scale, scales.len()),
    ] {
        if wanted(s) {
            runs += n as u64 * u64::from(a.repeats);
        }
    }
    env.bar.set_length(runs);

    let mut sections = Vec::new();
    if wanted(Scenario::Publish) {
        let rows = interleave(
            env,
            a.repeats,
            &a.publishers,
            |p| short_url(p),
            |p| serde_json::json!({ "publisher": txoutbox::redact::redact_url(p) }),
            |p| publish::run_once(env, p),
        )
        .await?;
        sections.push(Section {
            scenario: "publish",
            measures: publish::measures(env.events, env.aggregates),
            columns: publish::COLUMNS.to_vec(),
            rows,
        });
    }
    if wanted(Scenario::Drain) {
        let mut rows = interleave(
            env,
            a.repeats,
            &drains,
            |c| c.name(),
            |c| c.params(),
            |c| drain::run_once(env, c),
        )
        .await?;
        report::add_ratio_to_table(&mut rows, "events_per_s", "ratio_to_table");
        report::add_ratio_to_baseline(&mut rows, "events_per_s", "ratio_to_baseline");
        sections.push(Section {
            scenario: "drain",
            measures: drain::measures(env.events, env.aggregates, env.payload_bytes),
            columns: drain::COLUMNS.to_vec(),
            rows,
        });
    }
    if wanted(Scenario::Latency) {
        let rows = interleave(
            env,
            a.repeats,
            &latencies,
            |c| c.name(),
            |c| c.params(),
            |c| latency::run_once(env, c),
        )
        .await?;
        sections.push(Section {
            scenario: "latency",
            measures: latency::measures(env.duration, env.writers, env.grace),
            columns: latency::COLUMNS.to_vec(),
            rows,
        });
    }
    if wanted(Scenario::Write) {
        let mut rows = interleave(
            env,
            a.repeats,
            &writes,
            |c| c.name().to_string(),
            |c| c.params(),
            |c| write::run_once(env, *c),
        )
        .await?;
        write::add_ratios(&mut rows);
        sections.push(Section {
            scenario: "write",
            measures: write::measures(env.duration, env.writers),
            columns: write::COLUMNS.to_vec(),
            rows,
        });
    }
    if wanted(Scenario::Scale) {
        let mut rows = interleave(
            env,
            a.repeats,
            &scales,
            |c| c.name(),
            |c| c.params(),
            |c| drain::run_once(env, c),
        )
        .await?;
        report::add_ratio_to_table(&mut rows, "events_per_s", "ratio_to_table");
        report::add_ratio_to_baseline(&mut rows, "events_per_s", "ratio_to_baseline");
        sections.push(Section {
            scenario: "scale",
            measures: drain::measures(env.events, env.aggregates, env.payload_bytes),
            columns: drain::COLUMNS.to_vec(),
            rows,
        });
    }
    Ok(sections)
}

/// Run every configuration `repeats` times, interleaved (A B C A B C ...), so that drift of the
/// machine (other load, caches, autovacuum) spreads over all of them alike.
async fn interleave<'a, C, F, Fut>(
    env: &Env,
    repeats: u32,
    configs: &'a [C],
    name: impl Fn(&C) -> String,
    params: impl Fn(&C) -> serde_json::Value,
    run: F,
) -> anyhow::Result<Vec<Row>>
where
    F: Fn(&'a C) -> Fut,
    Fut: Future<Output = anyhow::Result<RunResult>>,
{
    let mut results: Vec<Vec<RunResult>> = vec![Vec::new(); configs.len()];
    for round in 0..repeats {
        for (i, c) in configs.iter().enumerate() {
            env.status(&format!("{} (run {} of {repeats})", name(c), round + 1));
            let r = run(c)
                .await
                .with_context(|| format!("{} (run {})", name(c), round + 1))?;
            results[i].push(r);
            env.bar.inc(1);
        }
    }
    Ok(configs
        .iter()
        .zip(results)
        .map(|(c, runs)| Row::new(name(c), params(c), &runs))
        .collect())
}

/// `CHECKPOINT` before a measured phase, as the reference scripts do: a checkpoint that a
/// previous run's WAL started (a drain writes hundreds of MB) would otherwise run during this
/// one, and the full-page writes after it make commits slower, so the interleaved runs would
/// not be alike. Needs superuser or `pg_checkpoint`; without them the bench says so once and
/// goes on.
pub async fn checkpoint(env: &Env) {
    static WARNED: std::sync::Once = std::sync::Once::new();
    if let Err(e) = sqlx::query("CHECKPOINT").execute(&env.pool).await {
        WARNED.call_once(|| {
            eprintln!(
                "warning: CHECKPOINT before each measured run failed ({e}); runs may include \
                 a checkpoint started by the previous one"
            )
        });
    }
}

/// Wait until no event of `db` is unpublished; fail after `stall` without progress (the
/// deadline moves on while events keep getting published, so slowness alone never fails).
pub async fn wait_published(db: &BenchDb, stall: Duration, what: &str) -> anyhow::Result<()> {
    let mut deadline = tokio::time::Instant::now() + stall;
    let mut last = i64::MAX;
    loop {
        let left = db.unpublished().await?;
        if left == 0 {
            return Ok(());
        }
        let now = tokio::time::Instant::now();
        if left < last {
            deadline = now + stall;
            last = left;
        }
        if now >= deadline {
            let dead = db.dead().await?;
            anyhow::bail!(
                "{left} event(s) not published after {}s without progress ({dead} dead \
                 letters): {what}",
                stall.as_secs()
            );
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Whether every event of `db` is published within `limit`.
pub async fn published_within(db: &BenchDb, limit: Duration) -> anyhow::Result<bool> {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if db.unpublished().await? == 0 {
            return Ok(true);
        }
        if tokio::time::Instant::now() >= deadline {
            return Ok(false);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
