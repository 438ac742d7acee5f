use std::process::ExitCode;

use crate::ctx::{Ctx, Db};

pub async fn run(ctx: &Ctx) -> anyhow::Result<ExitCode> {
    let db = ctx.db(1).await?;
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
    Ok(ExitCode::SUCCESS)
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
