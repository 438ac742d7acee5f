use std::process::ExitCode;

use txoutbox::store::{Retention, Store};

use crate::cli::StatusArgs;
use crate::cmd::slot::{describe, SlotReader};
use crate::ctx::Ctx;

pub async fn run(ctx: &Ctx, a: StatusArgs) -> anyhow::Result<ExitCode> {
    let db = ctx.db(1).await?;
    let store = db.store(&ctx.table, Retention::Mark);
    store.check_schema().await?;
    let c = store.counts().await?;
    let relays = store.relays().await?;
    let slot = match SlotReader::for_db(&db, ctx, a.slot.as_deref()) {
        Some(r) => r.read().await?,
        None => None,
    };
    if a.json {
        // The same document as the admin API's GET /api/v1/status (without a relay).
        let mut body = crate::admin::api::status_body(&ctx.table, &c, None, &relays, slot.as_ref());
        if let Some(name) = &ctx.outbox {
            body["outbox"] = serde_json::json!(name);
        }
        println!("{body}");
    } else {
        if let Some(name) = &ctx.outbox {
            println!("outbox     {name}");
        }
        println!("table      {}", ctx.table.display());
        println!("pending    {}", c.pending);
        println!("leased     {}", c.leased);
        println!("dead       {}", c.dead);
        println!("processed  {}", c.processed);
        match c.oldest_pending_age_secs {
            Some(s) => println!(
                "oldest     {}",
                txoutbox::relay::format_duration(std::time::Duration::from_secs(s.max(0.0) as u64))
            ),
            None => println!("oldest     -"),
        }
        let live: Vec<_> = relays.iter().filter(|r| r.alive).collect();
        println!("relays     {} live", live.len());
        for r in live {
            let age = (chrono::Utc::now() - r.heartbeat_at)
                .num_milliseconds()
                .max(0);
            println!(
                "  {}  {}  {} partition(s) {}  heartbeat {:.1}s ago",
                r.relay_id,
                r.mode,
                r.partitions.len(),
                ranges(&r.partitions),
                age as f64 / 1000.0
            );
        }
        if let Some(s) = &slot {
            println!("WAL source");
            for (k, v) in describe(s) {
                println!("  {k:<13} {v}");
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `[0, 1, 2, 5, 7, 8]` -> `0-2,5,7-8`.
fn ranges(p: &[i32]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < p.len() {
        let mut j = i;
        while j + 1 < p.len() && p[j + 1] == p[j] + 1 {
            j += 1;
        }
        out.push(if i == j {
            p[i].to_string()
        } else {
            format!("{}-{}", p[i], p[j])
        });
        i = j + 1;
    }
    out.join(",")
}

#[cfg(test)]
mod tests {
    #[test]
    fn ranges() {
        assert_eq!(super::ranges(&[0, 1, 2, 5, 7, 8]), "0-2,5,7-8");
        assert_eq!(super::ranges(&[]), "");
        assert_eq!(super::ranges(&[3]), "3");
    }
}
