use std::process::ExitCode;

use txoutbox::store::postgres::PgStore;
use txoutbox::store::DeadFilter;

use crate::cli::{DlqCommand, DlqFilter, DlqTarget};
use crate::ctx::Ctx;

fn filter(f: &DlqFilter) -> DeadFilter {
    DeadFilter {
        event_type: f.event_type.clone(),
        aggregate_type: f.aggregate_type.clone(),
        aggregate_id: f.aggregate_id.clone(),
        ..Default::default()
    }
}

fn target(t: &DlqTarget) -> DeadFilter {
    DeadFilter {
        id: t.id,
        ..filter(&t.filter)
    }
}

pub async fn run(ctx: &Ctx, cmd: DlqCommand) -> anyhow::Result<ExitCode> {
    let pool = ctx.pool(1).await?;
    let store = PgStore::new(pool, ctx.table.clone());
    store.check_schema().await?;
    match cmd {
        DlqCommand::List {
            filter: f,
            limit,
            json,
        } => {
            let events = store
                .list_dead(&DeadFilter {
                    limit: Some(limit),
                    ..filter(&f)
                })
                .await?;
            if json {
                for e in &events {
                    println!("{}", serde_json::to_string(e)?);
                }
            } else if events.is_empty() {
                println!("no dead letters");
            } else {
                println!(
                    "{:<36}  {:<20}  {:<20}  {:>8}  {:<25}  last error",
                    "id", "event type", "aggregate", "attempts", "dead since"
                );
                for e in &events {
                    println!(
                        "{:<36}  {:<20}  {:<20}  {:>8}  {:<25}  {}",
                        e.id,
                        e.event_type,
                        format!("{}/{}", e.aggregate_type, e.aggregate_id),
                        e.attempts,
                        e.dead_at
                            .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
                            .unwrap_or_default(),
                        e.last_error.as_deref().unwrap_or("")
                    );
                }
            }
        }
        DlqCommand::Retry(t) => {
            let n = store.retry_dead(&target(&t)).await?;
            report(&t, "retried", n);
            if t.id.is_some() && n == 0 {
                return Ok(ExitCode::FAILURE);
            }
        }
        DlqCommand::Discard(t) => {
            let n = store.discard_dead(&target(&t)).await?;
            report(&t, "discarded", n);
            if t.id.is_some() && n == 0 {
                return Ok(ExitCode::FAILURE);
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn report(t: &DlqTarget, verb: &str, n: u64) {
    if t.json {
        println!("{}", serde_json::json!({ verb: n }));
    } else if let (Some(id), 0) = (t.id, n) {
        eprintln!("no dead letter with id {id}");
    } else {
        println!("{verb} {n} dead letter(s)");
    }
}
