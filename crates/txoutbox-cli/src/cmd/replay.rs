//! `txoutbox replay`: publish retained events again, read-only on the table (the library's
//! `txoutbox::replay`), and `POST /api/v1/replay` on the command line.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use txoutbox::redact::redact_url;
use txoutbox::replay::{replay, Replay, ReplayError, ReplayFilter, ReplayReport};
use txoutbox::store::{Operator, Retention};

use super::events::filter;
use crate::cli::ReplayArgs;
use crate::ctx::{Ctx, UsageError};

/// How often a long replay logs its progress.
const PROGRESS_EVERY: Duration = Duration::from_secs(5);

/// The replay the flags ask for; an empty range is a usage error naming the flags.
pub fn replay_of(a: &ReplayArgs) -> anyhow::Result<Replay> {
    let mut events = filter(&a.filter, None);
    if let Some(since) = a.since {
        let since = chrono::Duration::from_std(since)
            .map_err(|_| UsageError(format!("--since {since:?} is too long")))?;
        events.created_after = Some(chrono::Utc::now() - since);
    }
    if let (Some(after), Some(before)) = (events.created_after, events.created_before) {
        if after >= before {
            return Err(UsageError(
                "--created-before must be later than --created-after (or --since): the time \
                 range is empty"
                    .into(),
            )
            .into());
        }
    }
    if let (Some(from), Some(to)) = (a.from_seq, a.to_seq) {
        if from > to {
            return Err(UsageError(format!(
                "--to-seq {to} is below --from-seq {from}: the seq range is empty"
            ))
            .into());
        }
    }
    Ok(Replay {
        filter: ReplayFilter {
            events,
            from_seq: a.from_seq,
            to_seq: a.to_seq,
        },
        limit: a.limit,
        rate: a.rate,
        ..Replay::default()
    })
}

pub async fn run(ctx: &Ctx, a: ReplayArgs) -> anyhow::Result<ExitCode> {
    let r = replay_of(&a)?;
    let store = ctx.db(1).await?.store(&ctx.table, Retention::Mark);
    store.check_schema().await?;
    let publisher = match (&a.publisher, a.dry_run) {
        (_, true) => None,
        (Some(url), false) => Some(super::open_publisher(url).await?),
        (None, false) => {
            return Err(UsageError(
                "no publisher given: pass --publisher URL (or --dry-run to count)".into(),
            )
            .into())
        }
    };
    let target = a.publisher.as_deref().map(redact_url).unwrap_or_default();
    if publisher.is_some() {
        let rate = r.rate.map_or("unlimited".to_string(), |n| format!("{n}/s"));
        let limit = r.limit.map_or("none".to_string(), |n| n.to_string());
        tracing::info!(publisher = %target, %rate, %limit, "replay started");
    }
    let started = Instant::now();
    let mut last_log = Instant::now();
    let mut progress = |p: &ReplayReport| {
        if last_log.elapsed() >= PROGRESS_EVERY {
            last_log = Instant::now();
            let last_seq = p.last_seq.unwrap_or_default();
            tracing::info!(replayed = p.replayed, last_seq, "replay progress");
        }
    };
    let outcome = replay(&*store, publisher.as_deref(), &r, &mut progress).await;
    if let Some(p) = &publisher {
        if let Err(e) = p.close().await {
            tracing::warn!(error = %txoutbox::redact::redact_secrets(&e.chain()), "closing the publisher");
        }
    }
    let report = match outcome {
        Ok(report) => report,
        Err(ReplayError::Publish {
            id,
            seq,
            message,
            done,
            ..
        }) => {
            anyhow::bail!(
                "event {id} (seq {seq}) was not published to {target}: {message}; {} event(s) \
                 were replayed before it: run the replay again with --from-seq {seq} to go on",
                done.replayed
            )
        }
        Err(ReplayError::Filter(e)) => return Err(UsageError(e.to_string()).into()),
        Err(e) => return Err(e.into()),
    };
    print(&*store, &report, &a, &target, started.elapsed()).await?;
    Ok(ExitCode::SUCCESS)
}

/// The final report: the count (and per event type), what to do when nothing matched, and
/// where to go on when --limit stopped it.
async fn print(
    store: &dyn Operator,
    report: &ReplayReport,
    a: &ReplayArgs,
    target: &str,
    took: Duration,
) -> anyhow::Result<()> {
    // Nothing matched: is anything retained at all? (A table whose relays delete on settle,
    // the WAL source's default, keeps no published row.)
    let none_kept = report.replayed == 0 && store.counts().await?.processed == 0;
    if a.json {
        let mut v = serde_json::to_value(report)?;
        v["dry_run"] = a.dry_run.into();
        v["retained"] = (!none_kept).into();
        println!("{v}");
    } else {
        let what = if a.dry_run {
            format!("would replay {} event(s)", report.replayed)
        } else {
            format!(
                "replayed {} event(s) to {target} in {:.1}s",
                report.replayed,
                took.as_secs_f64()
            )
        };
        println!("{what}");
        for (event_type, n) in &report.by_event_type {
            println!("  {n:>8}  {event_type}");
        }
        if a.dry_run {
            println!("dry run: nothing was published");
        }
    }
    if report.replayed == 0 {
        eprintln!("no retained event matches the filter");
        if none_kept {
            eprintln!(
                "the table keeps no published events: relays with --retention-period 0 (the \
                 WAL source's default) delete each event once published, and the purge deletes \
                 the others after their period (docs/operations.md#replay)"
            );
        }
    }
    if let Some(next) = report.next_from_seq {
        eprintln!("--limit reached and more events match: go on with --from-seq {next}");
    }
    Ok(())
}
