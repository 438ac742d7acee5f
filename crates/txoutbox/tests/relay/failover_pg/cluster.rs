//! A primary and a physical standby of PostgreSQL, private to one test (never the shared
//! server), made with PostgreSQL's own programs (`PG_BIN`: scripts/pg-matrix.sh gives each
//! major's): `initdb`, a physical slot for the standby, a copy of the primary's data directory
//! as its base backup (`standby.signal`, as `pg_basebackup -R` leaves it), the standby set up
//! as the failover docs ask (`primary_slot_name`, `hot_standby_feedback`, a dbname in
//! `primary_conninfo`, and on 17+ `sync_replication_slots`), commits synchronous to it
//! (`synchronous_standby_names`: what a writer saw committed survives the failover) and, on
//! 17+, `synchronized_standby_slots` on the primary.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use sqlx::{Connection, PgConnection};

use crate::common::pg_bin::{bin_dir, is_root, pg, run};
use crate::common::wait_until_for;

/// The standby's physical slot on the primary (and its `application_name`).
pub const STANDBY_SLOT: &str = "standby1";

/// One server: its directory (data, socket, log) and port.
pub struct Node {
    pub dir: PathBuf,
    pub port: u16,
    stopped: bool,
}

impl Node {
    fn data(&self) -> PathBuf {
        self.dir.join("data")
    }

    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    pub async fn connect(&self) -> PgConnection {
        PgConnection::connect(&self.url()).await.unwrap()
    }

    fn append(&self, file: &str, text: &str) {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(self.data().join(file))
            .unwrap();
        f.write_all(text.as_bytes()).unwrap();
    }

    fn start(&self) {
        run(
            pg("pg_ctl")
                .arg("-D")
                .arg(self.data())
                .args(["-w", "-t", "60", "-l"])
                .arg(self.dir.join("server.log"))
                .arg("start"),
            "pg_ctl start",
        );
    }

    /// Kill it: `pg_ctl stop -m immediate`, as a crash (no shutdown checkpoint).
    pub fn kill(&mut self) {
        run(
            pg("pg_ctl")
                .arg("-D")
                .arg(self.data())
                .args(["-m", "immediate", "-w", "stop"]),
            "pg_ctl stop -m immediate",
        );
        self.stopped = true;
    }

    /// Promote a standby and wait until it is a primary (`pg_ctl promote -w`).
    pub fn promote(&self) {
        run(
            pg("pg_ctl")
                .arg("-D")
                .arg(self.data())
                .args(["-w", "-t", "60", "promote"]),
            "pg_ctl promote",
        );
    }

    /// The end of the server's log, for a failure's message.
    pub fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if !self.stopped {
            let _ = pg("pg_ctl")
                .arg("-D")
                .arg(self.data())
                .args(["-m", "immediate", "-w", "stop"])
                .output();
        }
    }
}

/// The pair; the directory is removed when dropped.
pub struct Pair {
    pub root: PathBuf,
    pub major: u32,
    pub primary: Node,
    pub standby: Node,
}

impl Drop for Pair {
    fn drop(&mut self) {
        // The nodes stop first (fields drop after this body: stop them here).
        for node in [&mut self.primary, &mut self.standby] {
            if !node.stopped {
                let _ = pg("pg_ctl")
                    .arg("-D")
                    .arg(node.data())
                    .args(["-m", "immediate", "-w", "stop"])
                    .output();
                node.stopped = true;
            }
        }
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// The major version of the programs in [`bin_dir`].
pub fn major() -> u32 {
    let out = Command::new(bin_dir().join("postgres"))
        .arg("--version")
        .output()
        .unwrap();
    // "postgres (PostgreSQL) 17.10"
    let text = String::from_utf8_lossy(&out.stdout);
    let version = text.split_whitespace().last().unwrap_or_default();
    version
        .split('.')
        .next()
        .and_then(|m| m.parse().ok())
        .unwrap_or_else(|| panic!("cannot read the major version from {text:?}"))
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl Pair {
    /// Start a primary, then a standby streaming from it; returns once the standby streams
    /// and the primary's commits wait for it.
    pub async fn start() -> Self {
        let root = std::env::temp_dir().join(format!(
            "txo_failover_{}",
            &uuid::Uuid::new_v4().simple().to_string()[..12]
        ));
        let mk = |name: &str| Node {
            dir: root.join(name),
            port: free_port(),
            stopped: false,
        };
        let (primary, standby) = (mk("primary"), mk("standby"));
        std::fs::create_dir_all(&primary.dir).unwrap();
        std::fs::create_dir_all(&standby.dir).unwrap();
        if is_root() {
            run(
                Command::new("chown").args(["-R", "postgres:"]).arg(&root),
                "chown postgres",
            );
        }
        let major = major();
        let pair = Pair {
            root,
            major,
            primary,
            standby,
        };
        pair.start_primary();
        pair.start_standby().await;
        pair
    }

    fn start_primary(&self) {
        let p = &self.primary;
        run(
            pg("initdb").arg("-D").arg(p.data()).args([
                "-U",
                "postgres",
                "-A",
                "trust",
                "-E",
                "UTF8",
                "--no-sync",
            ]),
            "initdb",
        );
        p.append(
            "postgresql.conf",
            &format!(
                "\nlisten_addresses = '127.0.0.1'\nport = {}\nunix_socket_directories = '{}'\n\
                 wal_level = logical\nmax_wal_senders = 20\nmax_replication_slots = 20\n\
                 max_connections = 100\nshared_buffers = 32MB\nfsync = off\n\
                 hot_standby = on\nwal_sender_timeout = 10s\n",
                p.port,
                p.dir.display()
            ),
        );
        std::fs::write(
            p.data().join("pg_hba.conf"),
            "local all all trust\nlocal replication all trust\n\
             host all all 127.0.0.1/32 trust\nhost replication all 127.0.0.1/32 trust\n",
        )
        .unwrap();
        p.start();
    }

    async fn start_standby(&self) {
        let (p, s) = (&self.primary, &self.standby);
        let mut c = p.connect().await;
        // Reserving WAL at once: the standby starts from the copy's checkpoint.
        sqlx::query("SELECT pg_create_physical_replication_slot($1, true)")
            .bind(STANDBY_SLOT)
            .execute(&mut c)
            .await
            .unwrap();
        c.close().await.unwrap();
        // The base backup: a copy of the primary stopped cleanly (the server packages the
        // tests install ship no pg_basebackup), as `pg_basebackup -R` would leave it.
        run(
            pg("pg_ctl")
                .arg("-D")
                .arg(p.data())
                .args(["-m", "fast", "-w", "stop"]),
            "pg_ctl stop",
        );
        run(
            Command::new("cp").arg("-a").arg(p.data()).arg(s.data()),
            "copying the primary's data directory",
        );
        p.start();
        std::fs::write(s.data().join("standby.signal"), "").unwrap();
        // What the failover docs ask of a standby; later lines win over -R's.
        let mut conf = format!(
            "\nport = {}\nunix_socket_directories = '{}'\n\
             primary_conninfo = 'host=127.0.0.1 port={} user=postgres dbname=postgres \
             application_name={STANDBY_SLOT}'\n\
             primary_slot_name = '{STANDBY_SLOT}'\nhot_standby_feedback = on\n",
            s.port,
            s.dir.display(),
            p.port
        );
        if self.major >= 17 {
            conf.push_str("sync_replication_slots = on\n");
        }
        s.append("postgresql.auto.conf", &conf);
        s.start();
        let mut c = p.connect().await;
        wait_until_for(
            "the standby streams from the primary",
            Duration::from_secs(60),
            || async {
                let mut c = p.connect().await;
                sqlx::query_scalar::<_, bool>(
                    "SELECT EXISTS (SELECT FROM pg_stat_replication \
                     WHERE application_name = $1 AND state = 'streaming')",
                )
                .bind(STANDBY_SLOT)
                .fetch_one(&mut c)
                .await
                .unwrap()
            },
        )
        .await;
        let mut settings = vec![format!(
            "ALTER SYSTEM SET synchronous_standby_names = '{STANDBY_SLOT}'"
        )];
        if self.major >= 17 {
            settings.push(format!(
                "ALTER SYSTEM SET synchronized_standby_slots = '{STANDBY_SLOT}'"
            ));
        }
        settings.push("SELECT pg_reload_conf()".into());
        for sql in settings {
            sqlx::query(&sql).execute(&mut c).await.unwrap();
        }
    }

    /// A URL that names both servers, primary first, for read-write sessions.
    pub fn url(&self) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{},127.0.0.1:{}/postgres?target_session_attrs=read-write",
            self.primary.port, self.standby.port
        )
    }
}
