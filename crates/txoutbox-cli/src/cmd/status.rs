use std::process::ExitCode;

use txoutbox::store::postgres::PgStore;
use txoutbox::store::Store;

use crate::cli::StatusArgs;
use crate::ctx::Ctx;

pub async fn run(ctx: &Ctx, a: StatusArgs) -> anyhow::Result<ExitCode> {
    let pool = ctx.pool(1).await?;
    let store = PgStore::new(pool, ctx.table.clone());
    store.check_schema().await?;
    let c = store.counts().await?;
    if a.json {
        let v = serde_json::json!({
            "table": ctx.table.display(),
            "pending": c.pending,
            "leased": c.leased,
            "dead": c.dead,
            "processed": c.processed,
            "oldest_pending_age_secs": c.oldest_pending_age_secs,
        });
        println!("{v}");
    } else {
        println!("table      {}", ctx.table.display());
        println!("pending    {}", c.pending);
        println!("leased     {}", c.leased);
        println!("dead       {}", c.dead);
        println!("processed  {}", c.processed);
        match c.oldest_pending_age_secs {
            Some(s) => println!(
                "oldest     {}",
                humantime::format_duration(std::time::Duration::from_secs(s.max(0.0) as u64))
            ),
            None => println!("oldest     -"),
        }
    }
    Ok(ExitCode::SUCCESS)
}
