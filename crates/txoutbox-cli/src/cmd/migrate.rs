use std::process::ExitCode;

use txoutbox::relay::Source;

use crate::cli::MigrateArgs;
use crate::ctx::{Ctx, Db, UsageError};

pub async fn run(ctx: &Ctx, args: MigrateArgs) -> anyhow::Result<ExitCode> {
    let db = ctx.db(1).await?;
    if args.source == Some(Source::Wal) && !db.is_postgres() {
        return Err(UsageError(
            "migrate --source wal (TXOUTBOX_SOURCE): the WAL source and its lean write path \
             are PostgreSQL's; this database is read by --source table only"
                .into(),
        )
        .into());
    }
    let report = db.migrate(&ctx.table).await?;
    if let Some(name) = &ctx.outbox {
        print!("outbox {name}: ");
    }
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
    publication(ctx, &db).await;
    if let Some(source) = args.source {
        write_path(ctx, &db, source).await?;
    }
    Ok(ExitCode::SUCCESS)
}

/// PostgreSQL: give the table the write path of the source that will read it (a lean one for
/// the WAL source's stream, the full one for the table source).
#[cfg_attr(not(feature = "postgres"), allow(unused_variables))]
async fn write_path(ctx: &Ctx, db: &Db, source: Source) -> anyhow::Result<()> {
    #[cfg(feature = "postgres")]
    // Irrefutable when PostgreSQL is the only database compiled in.
    #[allow(irrefutable_let_patterns)]
    if let Db::Postgres(pool) = db {
        use anyhow::Context;
        use txoutbox::store::postgres::wal::{set_write_path, WritePath};
        let want = match source {
            Source::Wal => WritePath::Lean,
            _ => WritePath::Full,
        };
        let changed = set_write_path(pool, &ctx.table, want)
            .await
            .with_context(|| format!("{}: setting the write path", ctx.table.display()))?;
        let what = match want {
            WritePath::Lean => {
                "lean, for --source wal (wake-up trigger disabled, partition index dropped)"
            }
            WritePath::Full => "full (wake-up trigger enabled, partition index present)",
        };
        if changed {
            println!("{}: write path now {what}", ctx.table.display());
        } else {
            println!("{}: write path already {what}", ctx.table.display());
        }
    }
    Ok(())
}

/// PostgreSQL: the publication `relay --source wal` decodes through (inserts into the outbox
/// table only). It does not need `wal_level = logical` to exist, so it is made here, by the role
/// that owns the table; a failure is a warning, as only the WAL source needs it.
#[cfg_attr(not(feature = "postgres"), allow(unused_variables))]
async fn publication(ctx: &Ctx, db: &Db) {
    #[cfg(feature = "postgres")]
    // Irrefutable when PostgreSQL is the only database compiled in.
    #[allow(irrefutable_let_patterns)]
    if let Db::Postgres(pool) = db {
        use txoutbox::store::postgres::wal;
        let name = wal::publication_name(&ctx.table);
        match wal::ensure_publication(pool, &ctx.table).await {
            Ok(true) => println!(
                "{}: created publication {name} (for relay --source wal)",
                ctx.table.display()
            ),
            Ok(false) => {}
            // Set-up errors say what to do themselves (the name is another table's, or the
            // publication must be given its table back by its owner).
            Err(e @ wal::WalError::Setup(_)) => tracing::warn!(
                publication = %name,
                "the publication that `relay --source wal` needs (the table path needs none): {e}"
            ),
            Err(e) => {
                let e = txoutbox::redact::redact_secrets(&e.to_string());
                tracing::warn!(
                    publication = %name,
                    error = %e,
                    "could not create the publication that `relay --source wal` needs (the \
                     table path needs none): create it as the table's owner with \
                     CREATE PUBLICATION \"{name}\" FOR TABLE {} WITH (publish = 'insert'), or run \
                     `txoutbox migrate` as that role; the WAL source also needs a role with the \
                     REPLICATION attribute and wal_level = logical",
                    ctx.table.qualified()
                );
            }
        }
    }
}
