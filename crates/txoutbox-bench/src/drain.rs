//! `drain` and `scale`: N events inserted set-based, then relays (`txoutbox relay --drain`
//! child processes) publish them all; timed from the relays' start to the last one's exit.

use std::time::Instant;

use super::child::{RelayChild, RelaySpec};
use super::cost::{self, WireMeter};
use super::report::{col, Column, RunResult};
use super::schema::BenchDb;
use super::Env;
use txoutbox::relay::{Mode, Source};

pub const COLUMNS: &[Column] = &[
    col("events_per_s", "events/s", ""),
    col("seconds", "time", "s"),
    col("peak_rss_mib", "peak RSS", "MiB"),
    col("ratio_to_table", "ratio to table", ""),
    col("handed_off", "via table", "events"),
    col("ratio_to_baseline", "ratio to baseline", ""),
    col("db_bytes_in_per_event", "bytes from db", "/event"),
    col("db_bytes_out_per_event", "bytes to db", "/event"),
    col("round_trips_per_1k", "round trips", "/1k events"),
    col("wal_bytes_per_event", "WAL", "bytes/event"),
];

/// Which build runs a configuration: the only one, or one of the two that `--baseline-bin`
/// compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Build {
    Only,
    Current,
    Baseline,
}

impl Build {
    /// The builds to run each configuration with.
    pub fn all(env: &Env) -> &'static [Build] {
        if env.baseline.is_some() {
            &[Build::Current, Build::Baseline]
        } else {
            &[Build::Only]
        }
    }

    /// The `txoutbox` binary of this build.
    pub fn binary(self, env: &Env) -> &std::path::Path {
        match (self, &env.baseline) {
            (Build::Baseline, Some(b)) => b,
            _ => &env.txoutbox,
        }
    }

    /// The binary that migrates a run's schema: none (the bench's own library) unless two
    /// builds are compared, when each runs on the schema it knows.
    pub fn migrator(self, env: &Env) -> Option<(&std::path::Path, &str)> {
        (self != Build::Only).then(|| (self.binary(env), env.database_url.as_str()))
    }
}

pub fn measures(events: u64, aggregates: u64, payload_bytes: u64) -> String {
    format!(
        "{events} events over {aggregates} aggregates (~{payload_bytes}-byte JSON payloads) inserted set-based \
         in transactions of {per_tx} and VACUUM ANALYZEd (with --source wal after the \
         publication and slot were created), then `txoutbox relay --drain` child process(es) publish them all. \
         events/s = events / wall-clock from the relays' start to the last relay's exit \
         (process start-up, migration check and connection set-up included). Peak RSS = \
         largest VmHWM of one relay (sampled every 20 ms). A run fails unless every event was \
         published (processed_at set after the broker's ack). ratio to table (with \
         --source table,wal) = events/s / events/s of the same configuration reading the \
         table, in the same round. via table (wal) = events the WAL relay handed to its table \
         path instead of publishing them from the stream (0 unless publishes failed). tableless \
         (with --tableless) = the WAL source draining the same events written as transactional \
         logical messages (no rows), in the same transactions; done when the slot has \
         confirmed past the last one. ratio \
         to baseline (with --baseline-bin) = events/s / events/s of the same configuration run \
         by the baseline build, in the same round; each build runs on a schema it migrated. \
         With --costs, counted rather than timed (the same on a busy machine): bytes from \
         and to the database and round trips (the client's Sync and Query messages, each \
         answered before the next), through a counting proxy in front of PostgreSQL, per event; WAL = the server's WAL written \
         from the relays' start to their exit (after a CHECKPOINT, so the full-page images \
         are alike), per event (server-wide: run nothing else meanwhile).",
        per_tx = super::schema::EVENTS_PER_TX
    )
}

#[derive(Debug, Clone)]
pub struct DrainConfig {
    pub publisher: String,
    pub relays: u32,
    pub mode: Mode,
    pub source: Source,
    /// WAL source only: the events are tableless (logical messages, no rows).
    pub tableless: bool,
    pub build: Build,
}

impl DrainConfig {
    pub fn name(&self) -> String {
        format!(
            "{} relay{} {} {} -> {}{}",
            self.relays,
            if self.relays == 1 { "" } else { "s" },
            self.mode.as_str(),
            self.source_name(),
            super::short_url(&self.publisher),
            if self.build == Build::Baseline {
                " (baseline)"
            } else {
                ""
            }
        )
    }

    /// `table`, `wal`, or `tableless` (the WAL source, events without rows): the ratio to
    /// table compares each with the table source's row.
    fn source_name(&self) -> &'static str {
        if self.tableless {
            "tableless"
        } else {
            self.source.as_str()
        }
    }

    pub fn params(&self) -> serde_json::Value {
        let mut p = serde_json::json!({
            "publisher": txoutbox::redact::redact_url(&self.publisher),
            "relays": self.relays,
            "mode": self.mode.as_str(),
            "source": self.source_name(),
        });
        if self.build != Build::Only {
            p["build"] = serde_json::json!(if self.build == Build::Baseline {
                "baseline"
            } else {
                "current"
            });
        }
        p
    }
}

pub async fn run_once(env: &Env, cfg: &DrainConfig) -> anyhow::Result<RunResult> {
    empty_stream(&cfg.publisher).await?;
    let db = BenchDb::create(
        &env.pool,
        &env.registry,
        cfg.source,
        cfg.build.migrator(env),
    )
    .await?;
    let result = measure(env, &db, cfg).await;
    let dropped = db.drop().await;
    let r = result?;
    dropped?;
    Ok(r)
}

/// NATS stream name -> whether this bench made it (it was missing when the bench first looked,
/// before anything connected a publisher, which creates a missing stream).
static OURS: std::sync::OnceLock<std::sync::Mutex<std::collections::HashMap<String, bool>>> =
    std::sync::OnceLock::new();

/// The stream a `nats://` (or `tls://`) publisher URL publishes to: its name, and the stream
/// if it exists.
async fn find_stream(
    publisher: &str,
) -> anyhow::Result<(String, Option<async_nats::jetstream::stream::Stream>)> {
    use anyhow::Context as _;
    use async_nats::jetstream::context::GetStreamErrorKind;
    use async_nats::jetstream::ErrorCode;
    let watch = txoutbox::publish::nats::watch(publisher)
        .await
        .context("look for the publisher's NATS stream")?;
    let name = watch.stream;
    let js = async_nats::jetstream::new(watch.client);
    match js.get_stream(&name).await {
        Ok(stream) => Ok((name, Some(stream))),
        Err(e) => match e.kind() {
            GetStreamErrorKind::JetStream(j) if j.error_code() == ErrorCode::STREAM_NOT_FOUND => {
                Ok((name, None))
            }
            _ => Err(e).with_context(|| format!("find the NATS stream {name}")),
        },
    }
}

/// Whether this bench made stream `name`: what was noted the first time the bench met it, or
/// now (`missing`: it is not there), saying so when it is someone's.
fn ours(name: &str, missing: bool) -> bool {
    let Ok(mut seen) = OURS.get_or_init(Default::default).lock() else {
        return false;
    };
    *seen.entry(name.to_string()).or_insert_with(|| {
        if !missing {
            eprintln!(
                "NATS stream {name} was there before the bench: not emptied between runs \
                 (name a stream of the bench's own: ?stream=...&subject=...)"
            );
        }
        missing
    })
}

/// Before the bench connects a `nats://` (or `tls://`) publisher (which creates its stream when
/// missing), note whether the stream is there already: only a stream the bench made is emptied
/// between runs ([`empty_stream`]). Other publishers: nothing to do.
/// A URL or a server that fails here is reported by the publisher's own check right after
/// (a usage error for a bad URL); its stream, unnoted, then counts as someone's.
pub async fn meet_stream(publisher: &str) {
    if super::is_nats(publisher) {
        if let Ok((name, found)) = find_stream(publisher).await {
            ours(&name, found.is_none());
        }
    }
}

/// A `nats://` (or `tls://`) publisher's stream emptied before a run, so every run starts on
/// an empty stream as the first did: one that kept every run's events would grow by each (the
/// server's disk with it) and could slow the later runs. Only a stream this bench made (see
/// [`meet_stream`]): one that was there before is someone's (perhaps a real relay's
/// `OUTBOX`), and the runs add to it. Other publishers: nothing to do.
async fn empty_stream(publisher: &str) -> anyhow::Result<()> {
    use anyhow::Context as _;
    if !super::is_nats(publisher) {
        return Ok(());
    }
    let (name, found) = find_stream(publisher).await?;
    if let (true, Some(stream)) = (ours(&name, found.is_none()), found) {
        stream
            .purge()
            .await
            .with_context(|| format!("empty the NATS stream {name} before a run"))?;
    }
    Ok(())
}

async fn measure(env: &Env, db: &BenchDb, cfg: &DrainConfig) -> anyhow::Result<RunResult> {
    env.status(&format!("{}: inserting {} events", cfg.name(), env.events));
    // Tableless: where the last event's transaction ended, which the slot must have confirmed
    // once the relays are done.
    let emitted_to = if cfg.tableless {
        Some(db.emit_events(env.events, env.shape()).await?)
    } else {
        db.insert_events(env.events, env.shape()).await?;
        None
    };
    super::checkpoint(env).await;
    env.status(&format!("{}: draining", cfg.name()));
    // --costs: the relays reach the database through a counting proxy.
    let meter = if env.costs {
        Some(WireMeter::start(&env.database_url).await?)
    } else {
        None
    };
    let relay_url = match &meter {
        Some(m) => m.url(&env.database_url)?,
        None => env.database_url.clone(),
    };
    let wal_before = if env.costs {
        Some(cost::wal_position(&env.pool).await?)
    } else {
        None
    };
    let spec = RelaySpec {
        txoutbox: cfg.build.binary(env),
        database_url: &relay_url,
        schema: db.schema(),
        publisher: &cfg.publisher,
        mode: cfg.mode,
        source: cfg.source,
        drain: true,
        extra: &env.relay_args,
    };
    let start = Instant::now();
    let mut relays = (0..cfg.relays)
        .map(|_| RelayChild::spawn(&spec))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let outcomes = futures::future::join_all(relays.iter_mut().map(RelayChild::wait)).await;
    let elapsed = start.elapsed().as_secs_f64();
    for o in outcomes {
        o?;
    }
    let wal = match wal_before {
        Some(before) => Some(cost::wal_position(&env.pool).await? - before),
        None => None,
    };
    if let Some(end) = emitted_to {
        let confirmed = db.slot_confirmed().await?;
        if confirmed.is_none_or(|c| c < end) {
            anyhow::bail!(
                "the relays exited with the slot confirmed to {}, short of the tableless \
                 events' end at {end}: not every one was published",
                confirmed.map_or_else(|| "nothing".to_string(), |c| c.to_string())
            );
        }
    }
    let left = db.unpublished().await?;
    if left > 0 {
        let dead = db.dead().await?;
        anyhow::bail!(
            "{left} of {} events were not published after the relays exited \
             ({dead} dead letters)",
            env.events
        );
    }
    let peak = relays.iter().map(RelayChild::peak_kib).max().unwrap_or(0);
    let r = RunResult::default()
        .value("events_per_s", env.events as f64 / elapsed)
        .value("seconds", elapsed)
        .value("peak_rss_mib", peak as f64 / 1024.0);
    let r = match (&meter, wal) {
        (Some(m), Some(wal)) => {
            let w = m.read();
            if env.statements {
                let list: Vec<String> = m
                    .statements()
                    .iter()
                    .map(|(text, n)| format!("{n:>8}  {text}"))
                    .collect();
                env.bar.suspend(|| {
                    eprintln!("statements of {}:\n{}", cfg.name(), list.join("\n"));
                });
            }
            let n = env.events as f64;
            r.value("db_bytes_in_per_event", w.from_db as f64 / n)
                .value("db_bytes_out_per_event", w.to_db as f64 / n)
                .value("round_trips_per_1k", w.round_trips as f64 * 1000.0 / n)
                .value("wal_bytes_per_event", wal as f64 / n)
        }
        _ => r,
    };
    Ok(match cfg.source {
        Source::Wal => r.value("handed_off", db.handed_off().await? as f64),
        Source::Table => r,
    })
}
