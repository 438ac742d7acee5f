use std::process::ExitCode;

use crate::ctx::Ctx;

pub async fn run(ctx: &Ctx) -> anyhow::Result<ExitCode> {
    let db = ctx.db(1).await?;
    let report = db.migrate(&ctx.table).await?;
    if report.applied.is_empty() {
        println!(
            "{} is up to date (schema version {})",
            ctx.table.display(),
            report.version
        );
    } else {
        println!(
            "{}: applied migration(s) {:?}; schema version {}",
            ctx.table.display(),
            report.applied,
            report.version
        );
    }
    Ok(ExitCode::SUCCESS)
}
