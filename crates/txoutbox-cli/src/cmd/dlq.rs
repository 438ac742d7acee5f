//! `txoutbox dlq list|show|retry|discard`: the API's `/api/v1/dead-letters` on the command line.

use std::process::ExitCode;

use txoutbox::store::admin::EventFilter;
use txoutbox::store::postgres::PgStore;
use txoutbox::store::{DeadFilter, Operator, Retention};
use txoutbox::EventState;

use super::events::{filter, page, print_list, print_one};
use crate::cli::{DlqCommand, DlqFilter, DlqTarget};
use crate::ctx::{Ctx, Db, UsageError};

fn target(t: &DlqTarget) -> anyhow::Result<EventFilter> {
    let f = EventFilter {
        id: t.id,
        ..filter(&t.filter, Some(EventState::Dead))
    };
    f.check().map_err(|e| UsageError(e.to_string()))?;
    Ok(f)
}

pub async fn run(ctx: &Ctx, cmd: DlqCommand) -> anyhow::Result<ExitCode> {
    let pool = match ctx.db(1).await? {
        Db::Postgres(pool) => pool,
        #[allow(unreachable_patterns)]
        other => {
            let store = other.store(&ctx.table, Retention::Mark);
            return run_basic(store.as_ref(), cmd).await;
        }
    };
    let store = PgStore::new(pool, ctx.table.clone());
    store.check_schema().await?;
    match cmd {
        DlqCommand::List {
            filter: f,
            page: p,
            json,
        } => {
            let f = filter(&f, Some(EventState::Dead));
            f.check().map_err(|e| UsageError(e.to_string()))?;
            let got = store.list_events(&f, page(&p)).await?;
            print_list(&got.events, got.next_after_seq, json, "no dead letters")?;
        }
        DlqCommand::Show { id, json } => match store.get_event(id).await? {
            Some(e) if e.dead_at.is_some() && e.processed_at.is_none() => print_one(&e, json)?,
            _ => {
                eprintln!("no dead letter with id {id}");
                return Ok(ExitCode::FAILURE);
            }
        },
        DlqCommand::Retry(t) => {
            let n = store.retry_dead_matching(&target(&t)?).await?;
            report(&t, "retried", n);
            if t.id.is_some() && n == 0 {
                return Ok(ExitCode::FAILURE);
            }
        }
        DlqCommand::Discard(t) => {
            let n = store.discard_dead_matching(&target(&t)?).await?;
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

/// `dlq` on the databases without the event browser (SQLite): the same commands with the
/// filters every store has (id, event type, aggregate, a limit).
async fn run_basic(store: &dyn Operator, cmd: DlqCommand) -> anyhow::Result<ExitCode> {
    store.check_schema().await?;
    match cmd {
        DlqCommand::List {
            filter: f,
            page: p,
            json,
        } => {
            if p.after_seq.is_some() {
                return Err(UsageError("--after-seq needs PostgreSQL".into()).into());
            }
            let got = store
                .list_dead(&dead_filter(&f, None, Some(p.limit))?)
                .await?;
            print_list(&got, None, json, "no dead letters")?;
        }
        DlqCommand::Show { id, json } => {
            let f = DeadFilter {
                id: Some(id),
                ..Default::default()
            };
            match store.list_dead(&f).await?.first() {
                Some(e) => print_one(e, json)?,
                None => {
                    eprintln!("no dead letter with id {id}");
                    return Ok(ExitCode::FAILURE);
                }
            }
        }
        DlqCommand::Retry(t) => {
            let n = store
                .retry_dead(&dead_filter(&t.filter, t.id, None)?)
                .await?;
            report(&t, "retried", n);
            if t.id.is_some() && n == 0 {
                return Ok(ExitCode::FAILURE);
            }
        }
        DlqCommand::Discard(t) => {
            let n = store
                .discard_dead(&dead_filter(&t.filter, t.id, None)?)
                .await?;
            report(&t, "discarded", n);
            if t.id.is_some() && n == 0 {
                return Ok(ExitCode::FAILURE);
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn dead_filter(
    f: &DlqFilter,
    id: Option<uuid::Uuid>,
    limit: Option<i64>,
) -> anyhow::Result<DeadFilter> {
    if f.created_after.is_some() || f.created_before.is_some() {
        return Err(
            UsageError("--created-after and --created-before need PostgreSQL".into()).into(),
        );
    }
    Ok(DeadFilter {
        id,
        event_type: f.event_type.clone(),
        aggregate_type: f.aggregate_type.clone(),
        aggregate_id: f.aggregate_id.clone(),
        limit,
    })
}
