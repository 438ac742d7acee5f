//! PostgreSQL's own programs (`initdb`, `pg_ctl`, `pg_basebackup`), for tests that run private
//! clusters: `PG_BIN` (scripts/pg-matrix.sh sets it to each major's binaries), else the newest
//! `/usr/lib/postgresql/*/bin` (Debian). As root they run as the `postgres` user (initdb
//! refuses root).
#![allow(dead_code, clippy::unwrap_used)]

use std::path::PathBuf;
use std::process::Command;

/// PostgreSQL's programs: `PG_BIN`, else the newest `/usr/lib/postgresql/*/bin` (Debian).
pub fn bin_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("PG_BIN") {
        return PathBuf::from(dir);
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .expect("PostgreSQL server programs in /usr/lib/postgresql (or set PG_BIN)")
        .filter_map(|e| {
            let e = e.ok()?;
            let v: u32 = e.file_name().to_str()?.parse().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").exists().then_some((v, bin))
        })
        .collect();
    versions.sort();
    versions
        .pop()
        .expect("initdb in /usr/lib/postgresql/*/bin")
        .1
}

/// Are we root (then the servers run as `postgres`)?
pub fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

/// Run a PostgreSQL program, as the `postgres` user when we are root.
pub fn pg(program: &str) -> Command {
    let path = bin_dir().join(program).display().to_string();
    if is_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--", &path]);
        c
    } else {
        Command::new(path)
    }
}

/// Run `c`; panic with its output, naming `what`, if it fails.
pub fn run(c: &mut Command, what: &str) {
    let out = c.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        out.status.success(),
        "{what} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
