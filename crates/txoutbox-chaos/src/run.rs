//! One chaos run: set up, write and inject faults, drain, check, report.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use anyhow::{bail, Context};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sqlx::PgPool;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::audit::{install_claim_audit, print_violations, unfenced_sends};
use crate::broker::Broker;
use crate::check;
use crate::failover::{self, Postgres};
use crate::faults::{self, Kind, Link, Planned, Tally};
use crate::finish::{drain, resolve, unfinished};
use crate::proxy::Mode;
use crate::relays::{find_txoutbox, RelaySettings, RelaySlot};
use crate::slot;
use crate::workload::{self, WorkloadConfig};
use crate::Args;

pub(crate) const TABLE: &str = "public.outbox_events";

/// The run's temporary directory: removed on drop unless kept.
struct RunDir {
    path: PathBuf,
    keep: bool,
}

impl Drop for RunDir {
    fn drop(&mut self) {
        if self.keep {
            eprintln!("chaos: run directory kept: {}", self.path.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

/// Ok(true): every invariant held.
pub async fn run(args: Args, kinds: Vec<Kind>) -> anyhow::Result<bool> {
    let started = Instant::now();
    let txoutbox = find_txoutbox(args.txoutbox_bin.as_deref())?;
    // Declared first, dropped last: after PostgreSQL and the broker have stopped.
    let mut dir = RunDir {
        path: std::env::temp_dir().join(format!(
            "txoutbox-chaos-{}",
            &Uuid::new_v4().simple().to_string()[..8]
        )),
        keep: args.keep,
    };
    let logs = dir.path.join("logs");
    std::fs::create_dir_all(&logs).context("create the run directory")?;
    // The relays (restarted many times over a run) all run this copy: a build that replaces
    // the binary in the target directory mid-run must not change what is under test.
    let txoutbox = {
        let copy = dir.path.join("txoutbox");
        std::fs::copy(&txoutbox, &copy)
            .with_context(|| format!("copy {} into the run directory", txoutbox.display()))?;
        copy
    };
    let wal = args.source == "wal";
    // With the failover fault: a primary and a standby (`failover.rs`).
    let mut pg = Postgres::start(
        &args.pg_bin,
        &dir.path,
        wal,
        kinds.contains(&Kind::Failover),
    )
    .await
    .context("start PostgreSQL")?;
    let mut broker = match Broker::start(&args, &dir.path).await {
        Ok(b) => b,
        Err(e) => {
            dir.keep = true; // its output says why
            return Err(e);
        }
    };
    eprintln!(
        "chaos: seed {} | PostgreSQL {} | {} {} | {} relays ({}, source {}) | faults: {} | logs in {}",
        args.seed,
        pg.url(),
        broker.name(),
        broker.url(),
        args.relays,
        args.mode,
        args.source,
        kinds.iter().map(|k| k.name()).collect::<Vec<_>>().join(","),
        logs.display()
    );
    migrate(&txoutbox, &pg.url()).await?;
    let pool = failover::connect(&pg.url(), args.writers as u32 + 2)
        .await
        .context("connect to the run's PostgreSQL")?;
    install_claim_audit(&pool).await?;
    broker.prepare().await?;

    let settings = RelaySettings {
        exe: txoutbox,
        mode: args.mode.clone(),
        source: args.source.clone(),
        broker: broker.kind(),
        inject_faults: if kinds.contains(&Kind::Publisher) {
            args.publisher_fault_rate
        } else {
            0.0
        },
        lease: args.lease,
        partition_lease: args.partition_lease,
        log_dir: logs.clone(),
    };
    let mut slots = Vec::new();
    for i in 0..usize::from(args.relays) {
        slots.push(RelaySlot::new(i, &pg.addrs(), broker.addr(), &settings).await?);
    }

    // --- writers and faults ---------------------------------------------------------------
    let stop_writers = CancellationToken::new();
    let writers = tokio::spawn(workload::run(
        pool.clone(),
        WorkloadConfig {
            writers: args.writers,
            aggregates: args.aggregates,
            rate: args.rate,
            max_events: args.max_events,
            rollback_ratio: args.rollback_ratio,
            poison_ratio: args.poison_ratio,
            table: TABLE.into(),
        },
        args.seed,
        stop_writers.clone(),
    ));
    let mut rng = StdRng::seed_from_u64(args.seed);
    let mut tally = Tally::default();
    let mut schedule = faults::Schedule::new(&kinds);
    let end = Instant::now() + args.duration;
    let mut restarts_by_supervisor = 0u32;
    loop {
        let gap = args.fault_interval.mul_f64(rng.gen_range(0.5..1.5));
        let at = Instant::now() + gap;
        if at >= end {
            supervise_until(&mut slots, &settings, end, &mut restarts_by_supervisor).await?;
            break;
        }
        supervise_until(&mut slots, &settings, at, &mut restarts_by_supervisor).await?;
        let ready = match pg.pair() {
            Some(p) => p.ready().await,
            None => Ok(()),
        };
        let postponed = schedule.postponed;
        let fault = schedule.next(&mut rng, slots.len(), ready.is_ok());
        if let (true, Err(why)) = (schedule.postponed > postponed, &ready) {
            eprintln!("chaos: failover postponed: the standby is not ready ({why})");
        }
        let Some(mut fault) = fault else {
            continue;
        };
        inject(
            &mut fault,
            &mut slots,
            &settings,
            &mut pg,
            &mut broker,
            &pool,
            &args,
        )
        .await?;
        tally.add(&fault);
    }
    stop_writers.cancel();
    let truth = writers.await.context("writers")?;
    let (transactions, failed_tx, uncertain) = (
        truth.transactions,
        truth.failed_transactions,
        truth.uncertain.len(),
    );
    eprintln!(
        "chaos: writers stopped after {:?}; draining (up to {:?})",
        started.elapsed(),
        args.drain_timeout
    );

    // --- drain ------------------------------------------------------------------------------
    for s in &slots {
        s.pg.iter().for_each(|p| p.set(Mode::Pass));
        s.broker.set(Mode::Pass);
    }
    let drained = drain(
        &pool,
        &mut slots,
        &settings,
        args.drain_timeout,
        &mut restarts_by_supervisor,
    )
    .await?;
    let mut fenced = 0;
    for s in &slots {
        fenced += s.fenced_settles().await;
    }
    let mut unclean_exits = 0;
    for s in &mut slots {
        if !s.stop().await {
            unclean_exits += 1;
        }
    }

    // --- check ------------------------------------------------------------------------------
    let (deliveries, broker_note) = broker.deliveries().await?;
    let dead: HashSet<Uuid> =
        sqlx::query_scalar(&format!("SELECT id FROM {TABLE} WHERE dead_at IS NOT NULL"))
            .fetch_all(&pool)
            .await
            .context("read the dead letters")?
            .into_iter()
            .collect();
    let (final_truth, uncertain_committed, missing_commits) = resolve(&pool, truth).await?;
    let verdict = check::check(&final_truth, &deliveries, &dead);
    let audit = unfenced_sends(&pool, &slots, &final_truth, args.mode == "ordered", wal).await?;
    let sends: usize = slots
        .iter()
        .filter_map(|s| s.broker.tap())
        .map(|t| t.lock().map(|l| l.len()).unwrap_or(0))
        .sum();
    let attempts_failed: i64 =
        sqlx::query_scalar("SELECT coalesce(sum(attempts), 0)::int8 FROM chaos_commits")
            .fetch_one(&pool)
            .await
            .context("sum attempts")?;
    let unexpected_exits: u32 = slots.iter().map(|s| s.unexpected_exits).sum();
    let lock_lost_exits: u32 = slots.iter().map(|s| s.lock_lost_exits).sum();
    let db_lost_exits: u32 = slots.iter().map(|s| s.db_lost_exits).sum();
    let failover_exits: u32 = slots.iter().map(|s| s.failover_exits).sum();
    // Exits by design, each restarted by the supervisor.
    let wal_exits = lock_lost_exits + db_lost_exits + failover_exits;

    // --- report -----------------------------------------------------------------------------
    let ordered = args.mode == "ordered";
    println!(
        "run: seed={} duration={:?} relays={} mode={} source={} publisher={} wall={:.0?}",
        args.seed,
        args.duration,
        args.relays,
        args.mode,
        args.source,
        args.publisher,
        started.elapsed()
    );
    println!(
        "transactions: {} (rolled back events: {}, failed before commit: {}, commit outcome unknown: {} of which {} had committed)",
        transactions, verdict.rolled_back, failed_tx, uncertain, uncertain_committed
    );
    println!(
        "committed={} delivered={} deliveries={} dead={} (expected {}, unexpected {}) poison_wrong={}",
        verdict.committed,
        verdict.delivered,
        verdict.deliveries,
        dead.len(),
        verdict.dead_expected,
        verdict.dead_unexpected,
        verdict.poison_wrong
    );
    let breakdown: Vec<String> = tally
        .counts
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    println!(
        "faults: {}{}",
        if breakdown.is_empty() {
            "none".to_string()
        } else {
            breakdown.join(" ")
        },
        if settings.inject_faults > 0.0 {
            format!(
                " | publisher: {} of publishes fail transiently",
                settings.inject_faults
            )
        } else {
            String::new()
        }
    );
    let unfenced = audit.outside;
    let stream_sends = if wal {
        format!(
            " (and {} sends of the WAL stream, which holds no lease)",
            audit.unleased
        )
    } else {
        String::new()
    };
    let mut lock_lost = if wal {
        format!(" (WAL: {lock_lost_exits} readers whose slot lock connection died, by design; {db_lost_exits} whose database connection broke)")
    } else {
        String::new()
    };
    if let Some(p) = pg.pair() {
        lock_lost.push_str(&format!(
            " (failover: {failover_exits} because the primary moved)"
        ));
        let sends: Vec<(String, SystemTime)> = slots
            .iter()
            .filter_map(|s| s.broker.tap())
            .flat_map(|t| t.lock().map(|l| l.clone()).unwrap_or_default())
            .collect();
        let seq_of = |id: &str| {
            let id = Uuid::parse_str(id).ok()?;
            final_truth.committed.get(&id).map(|(_, seq)| *seq)
        };
        for line in failover::report(&p.promotions, &sends, seq_of) {
            println!("{line}");
        }
        if schedule.postponed > 0 {
            println!(
                "failover postponed {} times (the standby was not ready)",
                schedule.postponed
            );
        }
    }
    println!(
        "relays: sends seen on the wire={sends} failed attempts recorded={attempts_failed} fenced settles (live relays' metrics)={fenced} sends outside a held lease={unfenced}{stream_sends} (besides {} already in flight when a relay was frozen) exits by themselves={unexpected_exits}{lock_lost} unclean shutdowns={unclean_exits} drained={drained}",
        audit.in_flight_at_freeze
    );
    if let Some(note) = broker_note {
        println!("{note}");
    }
    if missing_commits > 0 {
        println!("committed by the writers but missing from the database: {missing_commits}");
    }
    if !drained {
        println!("{}", unfinished(&pool, &deliveries).await?);
    }
    if !verdict.lost_sample.is_empty() {
        println!("lost, for example: {:?}", verdict.lost_sample);
    }
    if !verdict.violations.is_empty() {
        print_violations(&pool, &slots, &verdict, wal).await?;
    }
    let ok = verdict.ok(ordered)
        && unfenced == 0
        && unexpected_exits == wal_exits
        && unclean_exits == 0
        && missing_commits == 0
        && drained
        && restarts_by_supervisor == wal_exits;
    println!(
        "lost={} phantom={} duplicates={} order_violations={} faults={}",
        verdict.lost,
        verdict.phantom,
        verdict.duplicates,
        if ordered {
            verdict.order_violations.to_string()
        } else {
            format!("{} (unordered: not checked)", verdict.order_violations)
        },
        tally.total()
    );
    if !ok {
        eprintln!(
            "chaos: FAILED: an invariant broke (see above); relay logs: {}",
            logs.display()
        );
        dir.keep = true;
    }
    pool.close().await;
    Ok(ok)
}

async fn migrate(txoutbox: &Path, url: &str) -> anyhow::Result<()> {
    let out = tokio::process::Command::new(txoutbox)
        .arg("migrate")
        .env("DATABASE_URL", url)
        .env_remove("TXOUTBOX_SCHEMA")
        .env_remove("TXOUTBOX_TABLE")
        .env_remove("TXOUTBOX_CONFIG")
        .output()
        .await
        .context("run txoutbox migrate")?;
    if !out.status.success() {
        bail!(
            "txoutbox migrate failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// Restart relays that exited by themselves, until `until`.
pub(crate) async fn supervise_until(
    slots: &mut [RelaySlot],
    settings: &RelaySettings,
    until: Instant,
    restarts: &mut u32,
) -> anyhow::Result<()> {
    loop {
        for s in slots.iter_mut() {
            if s.supervise(settings)?.is_some() {
                *restarts += 1;
            }
        }
        let now = Instant::now();
        if now >= until {
            return Ok(());
        }
        tokio::time::sleep((until - now).min(Duration::from_millis(250))).await;
    }
}

/// The slot-loss fault, its statements on `primary` (a connection to the node the run knows
/// is primary): the slot invalidated (every relay frozen meanwhile) or dropped.
async fn slot_loss(
    f: &mut Planned,
    slots: &mut [RelaySlot],
    pg: &mut Postgres,
    primary: &PgPool,
) -> anyhow::Result<()> {
    if f.invalidate && pg.pair().is_some_and(|p| p.rebuilding()) {
        // The standby's new slot, not streaming yet, would be invalidated too.
        eprintln!("chaos: slot loss: a standby is being made; dropping the slot rather than invalidating it");
        f.invalidate = false;
    }
    if f.invalidate {
        // Every relay frozen, so that the reader cannot confirm past the WAL that
        // the checkpoint removes.
        for s in slots.iter() {
            s.signal("STOP");
        }
        let stopped_at = SystemTime::now();
        let lost = slot::invalidate_all(primary).await;
        for s in slots.iter_mut() {
            s.signal("CONT");
            s.freezes.push((stopped_at, SystemTime::now()));
        }
        let lost = lost?;
        if !lost.is_empty() {
            eprintln!("chaos: slot loss: {lost:?} invalidated (wal_status = lost, max_slot_wal_keep_size) while every relay was frozen");
            return Ok(());
        }
        eprintln!("chaos: slot loss: the checkpoint invalidated no slot; dropping it instead");
        f.invalidate = false;
    }
    let dropped = slot::drop_all(primary).await?;
    eprintln!(
        "chaos: slot loss: dropped {dropped:?} (its reader's server process terminated first)"
    );
    Ok(())
}

async fn inject(
    f: &mut Planned,
    slots: &mut [RelaySlot],
    settings: &RelaySettings,
    pg: &mut Postgres,
    broker: &mut Broker,
    pool: &PgPool,
    args: &Args,
) -> anyhow::Result<()> {
    let who: Vec<&str> = f
        .relays
        .iter()
        .filter_map(|i| slots.get(*i).map(|s| s.relay_id.as_str()))
        .collect();
    let link = match f.link {
        Link::Postgres => "PostgreSQL",
        Link::Broker => broker.name(),
    };
    match f.kind {
        Kind::Kill => {
            eprintln!("chaos: SIGKILL {who:?}");
            for i in &f.relays {
                slots[*i].kill().await;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
            for i in &f.relays {
                slots[*i].spawn(settings)?;
            }
        }
        Kind::Stop => {
            // Past the event lease and the partition lease: others take its work over.
            let hold = args.lease.max(args.partition_lease) + Duration::from_secs(2);
            // Freeze it while it holds a claim (waiting up to 3 s for one), so that the
            // zombie wakes up with events another relay has taken over since: right after its
            // broker link carried a send (a batch is in flight; an ordered relay's claim is
            // its partitions, with no row to see), or while rows are leased to it.
            let ids: Vec<String> = who.iter().map(|w| w.to_string()).collect();
            let taps: Vec<_> = f
                .relays
                .iter()
                .filter_map(|i| slots[*i].broker.tap())
                .collect();
            let sent = |taps: &[crate::proxy::TapLog]| -> usize {
                taps.iter()
                    .map(|t| t.lock().map(|l| l.len()).unwrap_or(0))
                    .sum()
            };
            let before = sent(&taps);
            let until = Instant::now() + Duration::from_secs(3);
            let mut held = 0i64;
            loop {
                if sent(&taps) > before {
                    held = -1;
                    break;
                }
                held = sqlx::query_scalar(&format!(
                    "SELECT count(*) FROM {TABLE} WHERE locked_by = ANY($1) AND processed_at IS NULL"
                ))
                .bind(&ids)
                .fetch_one(pool)
                .await
                .unwrap_or(held);
                if held > 0 || Instant::now() >= until {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            let held = match held {
                -1 => "while sending".to_string(),
                0 => "holding nothing".to_string(),
                n => format!("holding {n} leased events"),
            };
            for i in &f.relays {
                slots[*i].signal("STOP");
            }
            // Taken once `kill` has returned, not before: spawning it takes milliseconds
            // (more on a loaded machine), in which the relay may still claim and send; the
            // in-flight-at-the-freeze allowance below must count from the real stop.
            let stopped_at = SystemTime::now();
            eprintln!("chaos: SIGSTOP {who:?} ({held}) for {hold:?}, then SIGCONT");
            tokio::time::sleep(hold).await;
            for i in &f.relays {
                slots[*i].signal("CONT");
                slots[*i].freezes.push((stopped_at, SystemTime::now()));
            }
        }
        Kind::Cut | Kind::Stall | Kind::Slow => {
            let mode = match f.kind {
                Kind::Cut => Mode::Cut,
                Kind::Stall => Mode::Stall,
                _ => Mode::Slow(f.latency),
            };
            eprintln!(
                "chaos: {} {link} for {who:?}, {:?} ({mode:?})",
                f.kind.name(),
                f.hold
            );
            for i in &f.relays {
                proxies_of(&slots[*i], f.link).for_each(|p| p.set(mode));
            }
            tokio::time::sleep(f.hold).await;
            for i in &f.relays {
                proxies_of(&slots[*i], f.link).for_each(|p| p.set(Mode::Pass));
            }
        }
        Kind::Reset => {
            eprintln!("chaos: reset {link} connections of {who:?}");
            for i in &f.relays {
                proxies_of(&slots[*i], f.link).for_each(|p| p.reset());
            }
        }
        Kind::PgRestart => {
            eprintln!("chaos: PostgreSQL crash and restart");
            pg.restart().await?;
        }
        Kind::BrokerRestart => {
            eprintln!("chaos: {} restart", broker.name());
            broker.restart().await?;
        }
        Kind::SlotLoss => {
            // On the primary itself (the run's pool may still hold a connection to a node a
            // failover just turned standby).
            let primary = sqlx::postgres::PgPoolOptions::new()
                .max_connections(1)
                .acquire_timeout(Duration::from_secs(10))
                .connect(&pg.primary_url())
                .await
                .context("slot loss: connect to the primary")?;
            let lost = slot_loss(f, slots, pg, &primary).await;
            primary.close().await;
            lost?;
        }
        Kind::Failover => {
            if let Some(pair) = pg.pair() {
                eprintln!(
                    "chaos: failover: kill the primary (immediate stop), promote the standby"
                );
                let p = pair.failover().await?;
                eprintln!(
                    "chaos: failover: node {} promoted in {:.2?}; making the old node a standby",
                    p.node, p.took
                );
            }
        }
        Kind::Publisher => {}
    }
    Ok(())
}

/// A relay's proxies on `link`: to the broker, or to each PostgreSQL server.
fn proxies_of(slot: &RelaySlot, link: Link) -> impl Iterator<Item = &crate::proxy::Proxy> {
    let (pg, broker) = match link {
        Link::Postgres => (&slot.pg[..], None),
        Link::Broker => (&[][..], Some(&slot.broker)),
    };
    pg.iter().chain(broker)
}
