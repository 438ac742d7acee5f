//! A physical standby made from a running primary, without `pg_basebackup` (the server
//! packages the matrix installs ship none): PostgreSQL's low-level online backup API. In one
//! session kept open, `pg_backup_start` (14: `pg_start_backup`), a copy of the data directory
//! (what `pg_basebackup` leaves out left out: the WAL, which the standby streams through its
//! slot, the replication slots, the postmaster's files, temporary state),
//! `pg_backup_stop` (14: `pg_stop_backup`), whose label file goes into the copy as
//! `backup_label`; then `standby.signal`. The copy is torn (the server writes on meanwhile):
//! recovery from the backup's start, with full-page writes, makes it consistent.

use std::io::ErrorKind;
use std::path::Path;

use anyhow::Context;
use sqlx::{Connection, PgConnection};

/// Directories whose contents the copy leaves out (as `pg_basebackup` does); each is made empty.
const EMPTY_DIRS: &[&str] = &[
    "pg_wal",
    "pg_replslot",
    "pg_stat_tmp",
    "pg_dynshmem",
    "pg_notify",
    "pg_serial",
    "pg_snapshots",
    "pg_subtrans",
];
/// Files the copy leaves out.
const SKIPPED_FILES: &[&str] = &[
    "postmaster.pid",
    "postmaster.opts",
    "standby.signal",
    "recovery.signal",
    "backup_label",
    "tablespace_map",
];

/// Copy the running primary's data directory (`url`, `from`) into `to` (made, or emptied
/// first) as a standby's: a base backup with its `backup_label`, and `standby.signal`. The
/// standby's slot must exist (with its WAL reserved) before: the copy holds no WAL.
pub async fn base_backup(url: &str, major: u32, from: &Path, to: &Path) -> anyhow::Result<()> {
    let mut c = PgConnection::connect(url)
        .await
        .context("connect to the primary for the base backup")?;
    let (start, stop) = if major >= 15 {
        (
            "SELECT pg_backup_start('txoutbox-chaos', true)::text",
            "SELECT labelfile FROM pg_backup_stop(false)",
        )
    } else {
        (
            "SELECT pg_start_backup('txoutbox-chaos', true, false)::text",
            "SELECT labelfile FROM pg_stop_backup(false, false)",
        )
    };
    sqlx::query_scalar::<_, String>(start)
        .fetch_one(&mut c)
        .await
        .context("start the online backup")?;
    let (src, dst) = (from.to_path_buf(), to.to_path_buf());
    let copied = tokio::task::spawn_blocking(move || copy_data_dir(&src, &dst))
        .await
        .context("the copy's thread")?;
    // Stopped whether the copy went well or not: a backup left open ends with the session.
    let label: Result<String, _> = sqlx::query_scalar(stop).fetch_one(&mut c).await;
    let _ = c.close().await;
    copied.context("copy the data directory")?;
    let label = label.context("stop the online backup")?;
    std::fs::write(to.join("backup_label"), label).context("write backup_label")?;
    std::fs::write(to.join("standby.signal"), "").context("write standby.signal")?;
    Ok(())
}

/// `from` into `to` (mode 0700, as the server wants its data directory), skipping what a base
/// backup leaves out. Files that vanish while it copies (the server drops them) are skipped.
fn copy_data_dir(from: &Path, to: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    match std::fs::remove_dir_all(to) {
        Err(e) if e.kind() != ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    std::fs::DirBuilder::new().mode(0o700).create(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        // The server's Unix-domain socket and its lock live here too (the run's
        // unix_socket_directories).
        if SKIPPED_FILES.contains(&name.as_ref()) || name.starts_with(".s.PGSQL.") {
            continue;
        }
        let target = to.join(entry.file_name());
        if EMPTY_DIRS.contains(&name.as_ref()) {
            std::fs::create_dir(&target)?;
            if name == "pg_wal" {
                std::fs::create_dir(target.join("archive_status"))?;
            }
            continue;
        }
        copy_entry(&entry.path(), &target)?;
    }
    Ok(())
}

fn copy_entry(from: &Path, to: &Path) -> std::io::Result<()> {
    let meta = match std::fs::symlink_metadata(from) {
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(()),
        r => r?,
    };
    if meta.is_dir() {
        std::fs::create_dir(to)?;
        let entries = match std::fs::read_dir(from) {
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(()),
            r => r?,
        };
        for entry in entries {
            let entry = entry?;
            copy_entry(&entry.path(), &to.join(entry.file_name()))?;
        }
        return Ok(());
    }
    if !meta.is_file() {
        return Ok(()); // a socket or the like
    }
    match std::fs::copy(from, to) {
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
        r => r.map(|_| ()),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn the_copy_leaves_out_what_a_base_backup_leaves_out() {
        let root = std::env::temp_dir().join(format!("chaos-bb-{}", uuid::Uuid::new_v4()));
        let (from, to) = (root.join("from"), root.join("to"));
        for d in ["base/1", "pg_wal/archive_status", "pg_replslot/s1"] {
            std::fs::create_dir_all(from.join(d)).unwrap();
        }
        for f in [
            "base/1/123",
            "pg_wal/000000010000000000000001",
            "pg_replslot/s1/state",
        ] {
            std::fs::write(from.join(f), "x").unwrap();
        }
        for f in [
            "PG_VERSION",
            "postmaster.pid",
            "postgresql.auto.conf",
            ".s.PGSQL.5.lock",
        ] {
            std::fs::write(from.join(f), "x").unwrap();
        }
        std::fs::create_dir_all(&to).unwrap();
        std::fs::write(to.join("stale"), "old").unwrap();
        copy_data_dir(&from, &to).unwrap();
        assert!(to.join("base/1/123").exists());
        assert!(to.join("PG_VERSION").exists() && to.join("postgresql.auto.conf").exists());
        assert!(!to.join("postmaster.pid").exists() && !to.join("stale").exists());
        assert!(!to.join(".s.PGSQL.5.lock").exists());
        assert!(to.join("pg_wal/archive_status").is_dir());
        assert_eq!(
            std::fs::read_dir(to.join("pg_replslot")).unwrap().count(),
            0
        );
        assert!(!to.join("pg_wal/000000010000000000000001").exists());
        std::fs::remove_dir_all(&root).unwrap();
    }
}
