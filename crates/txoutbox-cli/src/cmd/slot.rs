//! `txoutbox slot list|create|drop`: the WAL source's replication slot (PostgreSQL), and the
//! slot's reading that `status`, `/api/v1/status` and the dashboard show.

use std::process::ExitCode;

use serde::Serialize;
#[cfg(feature = "postgres")]
use sqlx::PgPool;

use crate::cli::SlotArgs;
use crate::ctx::{Ctx, Db, Kind, UsageError};

/// A replication slot as the operator sees it: `pg_replication_slots`, and which relay reads it.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct SlotStatus {
    /// The slot's name.
    pub slot: String,
    /// Its output plugin (`pgoutput` for the WAL source).
    pub plugin: Option<String>,
    /// `pg_replication_slots.active`: a session is decoding from it at this moment. The WAL
    /// source reads it in short statements, so this is mostly false even while a relay runs;
    /// `reader_pid` says whether one does.
    pub active: bool,
    /// The server process of the relay that holds the slot's lock (the one reader), if any.
    pub reader_pid: Option<i32>,
    /// `reserved`, `extended`, `unreserved` or `lost`.
    pub wal_status: Option<String>,
    /// The position up to which the relay confirmed delivery.
    pub confirmed_flush_lsn: Option<String>,
    /// WAL written since that position, in bytes: what the relay has not confirmed.
    pub lag_bytes: Option<i64>,
    /// Where a stream of the slot starts decoding (`restart_lsn`).
    pub restart_lsn: Option<String>,
    /// WAL written since `restart_lsn`, in bytes: what the slot keeps on the server's disk
    /// (at least `lag_bytes`).
    pub retained_bytes: Option<i64>,
    /// How much more WAL may be written before the slot is invalidated
    /// (`max_slot_wal_keep_size`); `None`: unlimited.
    pub safe_wal_size: Option<i64>,
    /// PostgreSQL 17+: a failover slot (standbys with `sync_replication_slots` keep a copy);
    /// `None` before 17.
    pub failover: Option<bool>,
    /// PostgreSQL 17+: a copy synchronized from a primary (on a standby, or left over on a
    /// promoted one); `None` before 17.
    pub synced: Option<bool>,
    /// PostgreSQL 17+: the server's `synchronized_standby_slots` (the standbys' physical slots
    /// that logical replication waits for; empty: none); `None` before 17.
    pub synchronized_standby_slots: Option<String>,
}

/// Reads one slot's [`SlotStatus`] on a PostgreSQL pool; `None` on other databases.
#[derive(Debug, Clone)]
pub struct SlotReader {
    #[cfg(feature = "postgres")]
    pool: PgPool,
    #[cfg(feature = "postgres")]
    table: txoutbox::OutboxTable,
    /// `--slot`; `None`: the table's own in this database, looked up at each read.
    name: Option<String>,
}

impl SlotReader {
    /// For `slot` (default: the table's in this database) on `db`, if it is PostgreSQL.
    #[cfg_attr(not(feature = "postgres"), allow(unused_variables))]
    pub fn for_db(db: &Db, ctx: &Ctx, slot: Option<&str>) -> Option<Self> {
        match db {
            #[cfg(feature = "postgres")]
            Db::Postgres(pool) => Some(Self {
                pool: pool.clone(),
                table: ctx.table.clone(),
                name: slot.map(str::to_string),
            }),
            #[allow(unreachable_patterns)]
            _ => None,
        }
    }

    /// The slot's name, as given (`--slot`), or `the table's slot`.
    pub fn name(&self) -> &str {
        self.name.as_deref().unwrap_or("the table's slot")
    }

    /// The slot now; `None` if it does not exist in this database.
    pub async fn read(&self) -> anyhow::Result<Option<SlotStatus>> {
        #[cfg(feature = "postgres")]
        {
            let slot = match &self.name {
                Some(s) => s.clone(),
                None => default_slot(&self.pool, &self.table).await?,
            };
            read(&self.pool, &slot).await
        }
        #[cfg(not(feature = "postgres"))]
        {
            Ok(None)
        }
    }
}

/// The table's own slot in this database: the one `relay --source wal` reads without
/// `--slot` (`txoutbox_<database>_<schema>_<table>`, or an older release's
/// `txoutbox_<schema>_<table>` that exists in this database).
#[cfg(feature = "postgres")]
pub async fn default_slot(pool: &PgPool, table: &txoutbox::OutboxTable) -> anyhow::Result<String> {
    use anyhow::Context;
    txoutbox::store::postgres::wal::default_slot(pool, table)
        .await
        .context("cannot name the table's replication slot")
}

/// The table's own slot by the URL alone (no connection): `--slot`'s default as
/// [`default_slot`] names it on a server without an older release's slot. For telling
/// outboxes apart before connecting.
#[cfg(feature = "postgres")]
pub fn default_slot_offline(ctx: &Ctx) -> String {
    use std::str::FromStr;
    let database = ctx
        .database_url()
        .and_then(|u| sqlx::postgres::PgConnectOptions::from_str(u).ok())
        .map(|o| {
            o.get_database()
                .map_or_else(|| o.get_username().to_owned(), str::to_owned)
        })
        .unwrap_or_default();
    txoutbox::store::postgres::wal::slot_name(&database, &ctx.table)
}

#[cfg(feature = "postgres")]
async fn read(pool: &PgPool, slot: &str) -> anyhow::Result<Option<SlotStatus>> {
    use anyhow::Context;
    let Some(info) = txoutbox::store::postgres::wal::slot_info(pool, slot)
        .await
        .with_context(|| format!("cannot read replication slot {slot}"))?
    else {
        return Ok(None);
    };
    let reader = txoutbox::store::postgres::wal::reader_pid(pool, slot)
        .await
        .with_context(|| format!("cannot look up the relay reading replication slot {slot}"))?;
    Ok(Some(SlotStatus {
        slot: info.name,
        plugin: info.plugin,
        active: info.active,
        reader_pid: reader,
        wal_status: info.wal_status,
        confirmed_flush_lsn: info.confirmed_flush_lsn.map(|l| l.to_string()),
        lag_bytes: info.lag_bytes,
        restart_lsn: info.restart_lsn.map(|l| l.to_string()),
        retained_bytes: info.retained_bytes,
        safe_wal_size: info.safe_wal_size,
        failover: info.failover,
        synced: info.synced,
        synchronized_standby_slots: txoutbox::store::postgres::wal::synchronized_standby_slots(
            pool,
        )
        .await
        .context("cannot read synchronized_standby_slots")?,
    }))
}

/// `1536` -> `1536 B (1.5 KiB)`; small values stay plain.
pub fn bytes(n: i64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if n.abs() < 1024 {
        return format!("{n} B");
    }
    let mut v = n as f64;
    let mut unit = "B";
    for u in UNITS {
        if v.abs() < 1024.0 {
            break;
        }
        v /= 1024.0;
        unit = u;
    }
    format!("{n} B ({v:.1} {unit})")
}

/// The lines `status` and `slot list` print about a slot, as (label, value).
pub fn describe(s: &SlotStatus) -> Vec<(&'static str, String)> {
    let opt = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".into());
    let mut lines = vec![
        ("slot", s.slot.clone()),
        (
            "reader",
            s.reader_pid.map_or_else(
                || "none (no relay reads it)".into(),
                |p| format!("a relay (server pid {p})"),
            ),
        ),
        ("active", if s.active { "yes" } else { "no" }.into()),
        (
            "wal_status",
            match s.wal_status.as_deref() {
                Some("lost") => "lost (its WAL is gone: the next `relay --source wal` creates it \
                                 again and delivers the rest from the table)"
                    .into(),
                _ => opt(&s.wal_status),
            },
        ),
        ("confirmed", opt(&s.confirmed_flush_lsn)),
        ("lag", s.lag_bytes.map_or_else(|| "-".into(), bytes)),
        (
            "retained",
            match (s.retained_bytes, &s.restart_lsn) {
                (Some(n), Some(lsn)) => {
                    format!("{} kept on disk, from restart_lsn {lsn}", bytes(n))
                }
                _ => "-".into(),
            },
        ),
        (
            "safe_wal_size",
            s.safe_wal_size
                .map_or_else(|| "unlimited (max_slot_wal_keep_size = -1)".into(), bytes),
        ),
        ("plugin", opt(&s.plugin)),
    ];
    // PostgreSQL 17+: whether the slot survives a failover.
    if let Some(failover) = s.failover {
        lines.push((
            "failover",
            if failover {
                "yes (standbys with sync_replication_slots keep a copy)".into()
            } else {
                "no (standbys keep no copy: after a failover the relay creates the slot again \
                 and delivers what it held from the table; drop it while no relay runs to have \
                 it created with failover)"
                    .into()
            },
        ));
    }
    if let Some(synced) = s.synced {
        lines.push(("synced", if synced { "yes" } else { "no" }.into()));
    }
    if let Some(standbys) = &s.synchronized_standby_slots {
        lines.push((
            "standby_slots",
            if standbys.is_empty() {
                "none (synchronized_standby_slots is empty: the relay may publish changes no \
                 standby has yet)"
                    .into()
            } else {
                format!("{standbys} (synchronized_standby_slots)")
            },
        ));
    }
    lines
}

pub async fn run(ctx: &Ctx, a: SlotArgs) -> anyhow::Result<ExitCode> {
    let url = ctx.require_url()?;
    let kind = crate::ctx::kind_of(url)?;
    if kind != Kind::Postgres {
        return Err(UsageError(format!(
            "txoutbox slot needs PostgreSQL (the WAL source's replication slot); this database \
             is {}, whose relay reads the table (--source table)",
            kind.name()
        ))
        .into());
    }
    #[cfg(feature = "postgres")]
    {
        let db = ctx.db(1).await?;
        // Irrefutable when PostgreSQL is the only database compiled in.
        #[allow(irrefutable_let_patterns)]
        let Db::Postgres(pool) = &db
        else {
            return Err(UsageError("txoutbox slot needs PostgreSQL".into()).into());
        };
        let slot = match a.slot.clone() {
            Some(s) => s,
            None => default_slot(pool, &ctx.table).await?,
        };
        pg::run(pool, &ctx.table, &slot, a.command).await
    }
    #[cfg(not(feature = "postgres"))]
    {
        let _ = a;
        Err(UsageError("this txoutbox was built without PostgreSQL support".into()).into())
    }
}

#[cfg(feature = "postgres")]
mod pg {
    use std::process::ExitCode;

    use anyhow::Context;
    use sqlx::PgPool;
    use txoutbox::store::postgres::wal;

    use super::{describe, read};
    use crate::cli::SlotCommand;

    pub async fn run(
        pool: &PgPool,
        table: &txoutbox::OutboxTable,
        slot: &str,
        cmd: SlotCommand,
    ) -> anyhow::Result<ExitCode> {
        match cmd {
            SlotCommand::List { json } => {
                let got = read(pool, slot).await?;
                match (got, json) {
                    (Some(s), true) => println!("{}", serde_json::to_string(&s)?),
                    (Some(s), false) => {
                        for (k, v) in describe(&s) {
                            println!("{k:<13} {v}");
                        }
                    }
                    (None, true) => {}
                    (None, false) => println!(
                        "no replication slot {slot} (`txoutbox slot create` or \
                         `txoutbox relay --source wal` creates it)"
                    ),
                }
            }
            SlotCommand::Create { json } => {
                wal::check_wal_level(pool).await?;
                txoutbox::check_schema(pool, table).await?;
                // As the relay opens it: created, and every unpublished event committed before
                // it existed handed to the table path (the stream never sees those).
                let store = txoutbox::store::postgres::PgStore::new(pool.clone(), table.clone());
                let opened = store.wal().with_slot(slot)?.open_slot().await?;
                if json {
                    println!(
                        "{}",
                        serde_json::json!({
                            "slot": slot,
                            "created": opened.created,
                            "handed_to_table": opened.handed_off,
                        })
                    );
                } else if opened.created {
                    println!(
                        "created replication slot {slot}: it keeps the server's WAL from now \
                         until a relay reads it (txoutbox relay --source wal)"
                    );
                    if opened.handed_off > 0 {
                        println!(
                            "{} unpublished event(s) committed before it will go by the table",
                            opened.handed_off
                        );
                    }
                } else {
                    println!("replication slot {slot} exists");
                }
            }
            SlotCommand::Drop { json } => {
                let Some(s) = read(pool, slot).await? else {
                    if json {
                        println!("{}", serde_json::json!({ "slot": slot, "dropped": false }));
                    }
                    eprintln!("no replication slot {slot}");
                    return Ok(ExitCode::FAILURE);
                };
                let in_use = || {
                    let who = s
                        .reader_pid
                        .map_or_else(String::new, |p| format!(" (server pid {p})"));
                    anyhow::anyhow!(
                        "replication slot {slot} is in use by a relay{who}: stop the \
                         `txoutbox relay --source wal` reading it, and its standbys, then drop it"
                    )
                };
                if s.active || s.reader_pid.is_some() {
                    return Err(in_use());
                }
                match wal::drop_slot(pool, slot).await {
                    Ok(_) => {}
                    // object_in_use: a reader took it between the look and the drop.
                    Err(wal::WalError::Database(sqlx::Error::Database(e)))
                        if e.code().as_deref() == Some("55006") =>
                    {
                        return Err(in_use());
                    }
                    Err(e) => {
                        return Err(e)
                            .with_context(|| format!("cannot drop replication slot {slot}"))
                    }
                }
                if json {
                    println!("{}", serde_json::json!({ "slot": slot, "dropped": true }));
                } else {
                    println!(
                        "dropped replication slot {slot}; the next `txoutbox relay --source wal` \
                         creates it again and delivers the unpublished events from the table"
                    );
                }
            }
        }
        Ok(ExitCode::SUCCESS)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn bytes_are_human_readable_too() {
        assert_eq!(super::bytes(0), "0 B");
        assert_eq!(super::bytes(1023), "1023 B");
        assert_eq!(super::bytes(1536), "1536 B (1.5 KiB)");
        assert_eq!(super::bytes(3 << 30), "3221225472 B (3.0 GiB)");
    }
}
