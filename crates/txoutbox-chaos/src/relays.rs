//! Real `txoutbox relay` processes, each behind its own two proxies (to PostgreSQL and to
//! the broker), so a fault can hit one relay's network without touching the others.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::Context;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, Command};

use crate::broker::BrokerKind;
use crate::cluster::free_port;
use crate::proxy::Proxy;

/// Everything a relay is started with.
#[derive(Debug, Clone)]
pub struct RelaySettings {
    pub exe: PathBuf,
    pub mode: String,
    /// `table` or `wal`: the relays' `--source`.
    pub source: String,
    pub broker: BrokerKind,
    pub inject_faults: f64,
    pub lease: Duration,
    pub partition_lease: Duration,
    pub log_dir: PathBuf,
}

pub struct RelaySlot {
    pub index: usize,
    generation: u32,
    pub relay_id: String,
    child: Option<Child>,
    /// To PostgreSQL: one per server (with the `failover` fault, the primary's and the
    /// standby's, both named in the relay's URL).
    pub pg: Vec<Proxy>,
    /// To the broker; taps what the relay publishes.
    pub broker: Proxy,
    admin_port: u16,
    /// Exits we did not cause.
    pub unexpected_exits: u32,
    /// Of those, a WAL relay's exits for its supervisor to restart it (counted with
    /// `--source wal` only): a reader whose slot lock's connection died (by design: a standby
    /// may read the slot by then)...
    pub lock_lost_exits: u32,
    /// ...and a relay (a standby waiting for the slot lock, or one starting) whose database
    /// connection broke: the table source rides that out, the WAL source exits.
    pub db_lost_exits: u32,
    /// With the `failover` fault only, a relay (of either source) that exited because the
    /// primary moved: at its start no server of its URL took read-write sessions (the primary
    /// dead, the standby not yet promoted), or its server turned standby under it (the old
    /// primary made a standby again) before its pool moved to the new primary
    /// (`recovery is in progress`, `logical decoding cannot be used while in recovery`,
    /// `read-only transaction`), or (WAL) its slot was not on the new primary.
    pub failover_exits: u32,
    /// SIGSTOP and SIGCONT times of this slot's relays.
    pub freezes: Vec<(std::time::SystemTime, std::time::SystemTime)>,
}

fn secs(d: Duration) -> String {
    format!("{}ms", d.as_millis())
}

impl RelaySlot {
    pub async fn new(
        index: usize,
        pg: &[SocketAddr],
        broker: SocketAddr,
        s: &RelaySettings,
    ) -> anyhow::Result<Self> {
        let mut proxies = Vec::new();
        for addr in pg {
            proxies.push(
                Proxy::start(*addr, None)
                    .await
                    .context("proxy to PostgreSQL")?,
            );
        }
        let mut slot = Self {
            index,
            generation: 0,
            relay_id: String::new(),
            child: None,
            pg: proxies,
            broker: Proxy::start(broker, Some(s.broker.tap()))
                .await
                .context("proxy to the broker")?,
            admin_port: 0,
            unexpected_exits: 0,
            lock_lost_exits: 0,
            db_lost_exits: 0,
            failover_exits: 0,
            freezes: Vec::new(),
        };
        slot.spawn(s)?;
        Ok(slot)
    }

    /// Start a (new) relay process for this slot.
    pub fn spawn(&mut self, s: &RelaySettings) -> anyhow::Result<()> {
        self.generation += 1;
        self.relay_id = format!("chaos-r{}-g{}", self.index, self.generation);
        self.admin_port = free_port()?;
        let hosts: Vec<String> = self
            .pg
            .iter()
            .map(|p| format!("127.0.0.1:{}", p.port()))
            .collect();
        // Several servers: the one that takes writes, found again after a failover.
        let db = match hosts.len() {
            1 => format!("postgres://postgres@{}/postgres", hosts[0]),
            _ => format!(
                "postgres://postgres@{}/postgres?target_session_attrs=read-write",
                hosts.join(",")
            ),
        };
        let publisher = s.broker.relay_url(self.broker.port());
        let log = s.log_dir.join(format!("{}.log", self.relay_id));
        let file = std::fs::File::create(&log).context("create a relay log")?;
        let child = Command::new(&s.exe)
            .args(["relay", "--publisher", &publisher, "--mode", &s.mode])
            .args(["--source", &s.source])
            .args(["--relay-id", &self.relay_id])
            .args(["--lease", &secs(s.lease)])
            .args(["--partition-lease", &secs(s.partition_lease)])
            .args(["--inject-faults", &s.inject_faults.to_string()])
            .args(["--admin-addr", &format!("127.0.0.1:{}", self.admin_port)])
            .args(["--batch-size", "200", "--poll-interval", "200ms"])
            .args(["--backoff-base", "20ms", "--backoff-max", "1s"])
            .args(["--max-attempts", "1000", "--shutdown-timeout", "5s"])
            .env("DATABASE_URL", db)
            .env("TXOUTBOX_LOG", "warn")
            .env_remove("TXOUTBOX_CONFIG")
            .env_remove("TXOUTBOX_SCHEMA")
            .env_remove("TXOUTBOX_TABLE")
            // Each source's own default retention (the WAL source deletes on settle).
            .env_remove("TXOUTBOX_RETENTION_PERIOD")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(file))
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("start {}", s.exe.display()))?;
        self.child = Some(child);
        Ok(())
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().and_then(|c| c.id())
    }

    pub fn signal(&self, sig: &str) {
        if let Some(pid) = self.pid() {
            let _ = std::process::Command::new("kill")
                .args([format!("-{sig}"), pid.to_string()])
                .status();
        }
    }

    /// SIGKILL and reap.
    pub async fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.start_kill();
            let _ = c.wait().await;
        }
    }

    /// If the process has exited by itself, count it and start a new one (a supervisor's job;
    /// the checker reports how often it was needed).
    pub fn supervise(&mut self, s: &RelaySettings) -> anyhow::Result<Option<String>> {
        let exited = match self.child.as_mut().map(|c| c.try_wait()) {
            Some(Ok(Some(status))) => Some(status.to_string()),
            _ => None,
        };
        if let Some(status) = &exited {
            self.unexpected_exits += 1;
            let log = s.log_dir.join(format!("{}.log", self.relay_id));
            let wal = s.source == "wal";
            let why = match last_error(&log) {
                Some(e) if self.pg.len() > 1 && e.contains("serves a read-write session") => {
                    self.failover_exits += 1;
                    ": no server took read-write sessions at its start (a failover under way)"
                }
                Some(e)
                    if self.pg.len() > 1
                        && (e.contains("recovery is in progress")
                            || e.contains("while in recovery")
                            || e.contains("read-only transaction")) =>
                {
                    self.failover_exits += 1;
                    ": its server became a standby before its pool moved to the new primary"
                }
                Some(e) if wal && self.pg.len() > 1 && e.contains("does not exist") => {
                    self.failover_exits += 1;
                    ": its slot was not on the new primary (lost at the promotion before 17)"
                }
                Some(e) if wal && e.contains("lost the connection that holds slot") => {
                    self.lock_lost_exits += 1;
                    ": its slot lock's connection died, by design"
                }
                Some(e) if wal && e.contains("error communicating with database") => {
                    self.db_lost_exits += 1;
                    ": a WAL relay's database connection broke"
                }
                _ => "",
            };
            eprintln!(
                "chaos: relay {} exited by itself ({status}{why}); restarting it (see {})",
                self.relay_id,
                log.display()
            );
            self.spawn(s)?;
        }
        Ok(exited)
    }

    /// `outbox_settles_fenced_total` from the relay's metrics (0 when unreachable).
    pub async fn fenced_settles(&self) -> u64 {
        metric(self.admin_port, "outbox_settles_fenced_total")
            .await
            .unwrap_or(0.0) as u64
    }

    /// SIGTERM, and wait for a clean exit. Returns whether it exited with status 0.
    pub async fn stop(&mut self) -> bool {
        self.signal("TERM");
        let Some(mut c) = self.child.take() else {
            return false;
        };
        match tokio::time::timeout(Duration::from_secs(30), c.wait()).await {
            Ok(Ok(status)) => status.success(),
            _ => {
                let _ = c.start_kill();
                let _ = c.wait().await;
                false
            }
        }
    }
}

/// The error a relay that exited gave, from its log (`error: relay failed: ...`; log lines
/// of its last moments may follow it).
fn last_error(log: &Path) -> Option<String> {
    let text = std::fs::read(log).ok()?;
    let tail = &text[text.len().saturating_sub(8192)..];
    String::from_utf8_lossy(tail)
        .lines()
        .rev()
        .find(|l| l.starts_with("error: "))
        .map(str::to_string)
}

/// One value from a Prometheus text endpoint, by plain HTTP/1.0.
async fn metric(port: u16, name: &str) -> Option<f64> {
    let mut s = tokio::time::timeout(
        Duration::from_secs(2),
        tokio::net::TcpStream::connect(("127.0.0.1", port)),
    )
    .await
    .ok()?
    .ok()?;
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")
        .await
        .ok()?;
    let mut body = String::new();
    tokio::time::timeout(Duration::from_secs(5), s.read_to_string(&mut body))
        .await
        .ok()?
        .ok()?;
    body.lines()
        .filter(|l| l.starts_with(name))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .reduce(|a, b| a + b)
}

/// The `txoutbox` binary: the given one, or the one next to this binary.
pub fn find_txoutbox(given: Option<&Path>) -> anyhow::Result<PathBuf> {
    if let Some(p) = given {
        return Ok(p.to_path_buf());
    }
    let me = std::env::current_exe().context("where is this binary")?;
    let next = me.with_file_name("txoutbox");
    if next.exists() {
        return Ok(next);
    }
    anyhow::bail!(
        "no txoutbox binary next to {} (build it with `cargo build -p txoutbox-cli`, or pass --txoutbox-bin)",
        me.display()
    )
}
