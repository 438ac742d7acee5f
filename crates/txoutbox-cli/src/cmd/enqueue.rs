use std::process::ExitCode;

use txoutbox::{JsonPayload, NewEvent};

use crate::cli::EnqueueArgs;
use crate::ctx::{Ctx, UsageError};

pub async fn run(ctx: &Ctx, a: EnqueueArgs) -> anyhow::Result<ExitCode> {
    let mut event = match (&a.payload, &a.bytes_file, &a.content_type) {
        (_, Some(path), Some(content_type)) => {
            let data = std::fs::read(path).map_err(|e| {
                UsageError(format!("--bytes-file: cannot read {}: {e}", path.display()))
            })?;
            NewEvent::bytes(
                a.aggregate_type,
                a.aggregate_id,
                a.event_type,
                data,
                content_type,
            )
            .map_err(|e| UsageError(format!("--content-type: {e}")))?
        }
        (Some(json), _, _) => {
            // Kept as written: no digit of a number is rounded on the way to the table.
            let payload = JsonPayload::from_text(json)
                .map_err(|e| UsageError(format!("--payload is not valid JSON: {e}")))?;
            NewEvent::from_payload(a.aggregate_type, a.aggregate_id, a.event_type, payload)
        }
        // clap requires --payload or --bytes-file, and --content-type with the file.
        _ => return Err(UsageError("give --payload JSON or --bytes-file PATH".into()).into()),
    };
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
