//! `txoutbox dlq list|show|retry|discard`: the API's `/api/v1/dead-letters` on the command line.

use std::process::ExitCode;

use txoutbox::store::{EventFilter, Retention};
use txoutbox::EventState;

use super::events::{filter, page, print_list, print_one};
use crate::cli::{DlqCommand, DlqTarget};
use crate::ctx::{Ctx, UsageError};

fn target(t: &DlqTarget) -> anyhow::Result<EventFilter> {
    let f = EventFilter {
        id: t.id,
        ..filter(&t.filter, Some(EventState::Dead))
    };
    f.check().map_err(|e| UsageError(e.to_string()))?;
    Ok(f)
}

pub async fn run(ctx: &Ctx, cmd: DlqCommand) -> anyhow::Result<ExitCode> {
    let store = ctx.db(1).await?.store(&ctx.table, Retention::Mark);
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
        DlqCommand::Show {
            id,
            json,
            payload_limit,
        } => match store.get_event(id).await? {
            Some(e) if e.dead_at.is_some() && e.processed_at.is_none() => {
                print_one(e, json, payload_limit)?
            }
            _ => {
                eprintln!("no dead letter with id {id}");
                return Ok(ExitCode::FAILURE);
            }
        },
        DlqCommand::Retry(t) => {
            let n = store.retry_dead(&target(&t)?).await?;
            report(&t, "retried", n);
            if t.id.is_some() && n == 0 {
                return Ok(ExitCode::FAILURE);
            }
        }
        DlqCommand::Discard(t) => {
            let n = store.discard_dead(&target(&t)?).await?;
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
