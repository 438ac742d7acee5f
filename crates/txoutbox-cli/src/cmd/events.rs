//! `txoutbox events list|show`: the API's `/api/v1/events` on the command line.

use std::process::ExitCode;

use txoutbox::store::{EventFilter, Page, Retention};
use txoutbox::{EventState, OutboxEvent};

use crate::cli::{DlqFilter, EventsCommand, PageArgs};
use crate::ctx::Ctx;

/// The filter flags shared by `dlq` and `events`, as the library's filter.
pub fn filter(f: &DlqFilter, state: Option<EventState>) -> EventFilter {
    EventFilter {
        state,
        id: None,
        event_type: f.event_type.clone(),
        aggregate_type: f.aggregate_type.clone(),
        aggregate_id: f.aggregate_id.clone(),
        created_after: f.created_after,
        created_before: f.created_before,
    }
}

pub fn page(p: &PageArgs) -> Page {
    Page {
        after_seq: p.after_seq,
        limit: p.limit,
    }
}

pub async fn run(ctx: &Ctx, cmd: EventsCommand) -> anyhow::Result<ExitCode> {
    let store = ctx.db(1).await?.store(&ctx.table, Retention::Mark);
    store.check_schema().await?;
    match cmd {
        EventsCommand::List {
            state,
            filter: f,
            page: p,
            json,
        } => {
            let f = filter(&f, state);
            f.check()
                .map_err(|e| crate::ctx::UsageError(e.to_string()))?;
            let got = store.list_events(&f, page(&p)).await?;
            print_list(&got.events, got.next_after_seq, json, "no events")?;
        }
        EventsCommand::Show {
            id,
            json,
            payload_limit,
        } => match store.get_event(id).await? {
            Some(e) => print_one(e, json, payload_limit)?,
            None => {
                eprintln!("no event with id {id}");
                return Ok(ExitCode::FAILURE);
            }
        },
    }
    Ok(ExitCode::SUCCESS)
}

/// A table (or JSON lines), and the cursor for the next page on stderr.
pub fn print_list(
    events: &[OutboxEvent],
    next: Option<i64>,
    json: bool,
    none: &str,
) -> anyhow::Result<()> {
    if json {
        for e in events {
            println!("{}", serde_json::to_string(e)?);
        }
    } else if events.is_empty() {
        println!("{none}");
    } else {
        let now = chrono::Utc::now();
        println!(
            "{:>8}  {:<36}  {:<9}  {:<20}  {:<20}  {:>8}  {:<20}  last error",
            "seq", "id", "state", "event type", "aggregate", "attempts", "created"
        );
        for e in events {
            println!(
                "{:>8}  {:<36}  {:<9}  {:<20}  {:<20}  {:>8}  {:<20}  {}",
                e.seq,
                e.id,
                state_name(e.state(now)),
                e.event_type,
                format!("{}/{}", e.aggregate_type, e.aggregate_id),
                e.attempts,
                e.created_at
                    .to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
                e.last_error.as_deref().unwrap_or("")
            );
        }
    }
    if let Some(n) = next {
        eprintln!("more: pass --after-seq {n} for the next page");
    }
    Ok(())
}

/// One event in full; with `payload_limit`, its payload cut to that many bytes (JSON: the
/// payload as `payload_preview`, `payload_length`, `payload_truncated`, as lists carry it).
pub fn print_one(e: OutboxEvent, json: bool, payload_limit: Option<usize>) -> anyhow::Result<()> {
    if json {
        match payload_limit {
            None => println!("{}", serde_json::to_string(&e)?),
            Some(max) => {
                let p = crate::preview::preview(&e, max);
                let mut v = crate::preview::listed(e);
                v["payload_preview"] = p.text.into();
                v["payload_truncated"] = p.truncated.into();
                println!("{v}");
            }
        }
        return Ok(());
    }
    let t = |t: Option<chrono::DateTime<chrono::Utc>>| {
        t.map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
            .unwrap_or_else(|| "-".into())
    };
    println!("id          {}", e.id);
    println!("seq         {}", e.seq);
    println!("state       {}", state_name(e.state(chrono::Utc::now())));
    println!("event type  {}", e.event_type);
    println!("aggregate   {}/{}", e.aggregate_type, e.aggregate_id);
    println!("attempts    {}", e.attempts);
    println!("created     {}", t(Some(e.created_at)));
    println!("published   {}", t(e.processed_at));
    println!("dead since  {}", t(e.dead_at));
    println!("last error  {}", e.last_error.as_deref().unwrap_or("-"));
    println!("headers     {}", serde_json::to_string(&e.headers)?);
    let p = crate::preview::preview(&e, payload_limit.unwrap_or(usize::MAX));
    let cut = if p.truncated {
        format!(
            " ... (the first {} bytes shown of {})",
            p.text.len(),
            p.length
        )
    } else {
        String::new()
    };
    match &e.payload_bytes {
        Some(bytes) => println!(
            "payload     base64 {}{cut} ({} bytes, {})",
            p.text,
            bytes.len(),
            e.content_type()
        ),
        None => println!("payload     {}{cut}", p.text),
    }
    Ok(())
}

pub fn state_name(s: EventState) -> &'static str {
    match s {
        EventState::Pending => "pending",
        EventState::Leased => "leased",
        EventState::Published => "published",
        EventState::Dead => "dead",
    }
}
