use std::process::ExitCode;

use txoutbox::NewEvent;

use crate::cli::EnqueueArgs;
use crate::ctx::{Ctx, UsageError};

pub async fn run(ctx: &Ctx, a: EnqueueArgs) -> anyhow::Result<ExitCode> {
    let payload: serde_json::Value = serde_json::from_str(&a.payload)
        .map_err(|e| UsageError(format!("--payload is not valid JSON: {e}")))?;
    let mut event = NewEvent::from_json(a.aggregate_type, a.aggregate_id, a.event_type, payload);
    if let Some(id) = a.id {
        event = event.with_id(id);
    }
    for h in &a.headers {
        let Some((k, v)) = h.split_once('=') else {
            return Err(UsageError(format!("--header {h:?}: expected K=V")).into());
        };
        if k.is_empty() {
            return Err(UsageError(format!("--header {h:?}: the name is empty")).into());
        }
        event = event.header(k, v);
    }
    let db = ctx.db(1).await?;
    db.check_schema(&ctx.table).await?;
    let id = db.enqueue(&ctx.table, &event).await?;
    println!("{id}");
    Ok(ExitCode::SUCCESS)
}
