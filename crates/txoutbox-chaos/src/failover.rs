//! The `failover` fault: the run's PostgreSQL is a primary and a physical standby (nodes `a`
//! and `b`, on ports fixed for the run), set up as `crates/txoutbox/tests/relay/failover_pg`
//! sets them up and docs/wal.md asks: the standby's own physical slot (`primary_slot_name`),
//! `hot_standby_feedback`, a dbname in `primary_conninfo`, on 17+ `sync_replication_slots` on
//! the standby and `synchronized_standby_slots` on the primary, and commits synchronous to it
//! (`synchronous_standby_names`), so that what a writer saw committed survives.
//!
//! The fault kills the primary (an immediate stop, as a crash) and promotes the standby.
//! Relays, writers and the checker name both nodes (`target_session_attrs=read-write`) and
//! find the new primary. The old node does not rejoin as it is: it may hold WAL the standby
//! never received (a commit waiting for the standby when it died), which only `pg_rewind`
//! would undo; it is made again, a fresh base backup of the new primary (`basebackup.rs`), in
//! the background while the other faults go on. Until that standby streams (and on 17+ holds
//! a synchronized, usable copy of every failover slot) another failover is postponed.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use anyhow::{bail, Context};
use sqlx::{Connection, PgConnection, PgPool};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::basebackup::base_backup;
use crate::cluster::{chown_to_postgres, free_port, PgCluster};

/// The run's PostgreSQL: one server, or a primary and a standby with the `failover` fault.
pub enum Postgres {
    One(PgCluster),
    Two(Box<Pair>),
}

impl Postgres {
    pub async fn start(bin: &Path, root: &Path, logical: bool, pair: bool) -> anyhow::Result<Self> {
        Ok(if pair {
            Postgres::Two(Box::new(Pair::start(bin, root, logical).await?))
        } else {
            Postgres::One(PgCluster::start(bin, root, logical).await?)
        })
    }

    /// What the run's own tools connect with: the server, or both nodes for a read-write
    /// session (the pool of [`connect`] follows the primary).
    pub fn url(&self) -> String {
        match self {
            Postgres::One(pg) => pg.url(),
            Postgres::Two(p) => p.url(),
        }
    }

    /// The primary alone, for what must write there and nowhere else (the slot-loss fault).
    /// The pool of [`connect`] follows the primary, but only after it notices a failover: a
    /// connection it still holds to the node just turned standby refuses to write WAL.
    pub fn primary_url(&self) -> String {
        match self {
            Postgres::One(pg) => pg.url(),
            Postgres::Two(p) => p.nodes[p.primary].url(),
        }
    }

    /// The servers, in the order a relay's URL names them (each through its own proxy).
    pub fn addrs(&self) -> Vec<SocketAddr> {
        match self {
            Postgres::One(pg) => vec![pg.addr()],
            Postgres::Two(p) => p.nodes.iter().map(|n| n.addr()).collect(),
        }
    }

    /// The `pg-restart` fault: crash and restart the (primary) server.
    pub async fn restart(&self) -> anyhow::Result<()> {
        match self {
            Postgres::One(pg) => pg.restart().await,
            Postgres::Two(p) => p.nodes[p.primary].restart().await,
        }
    }

    pub fn pair(&mut self) -> Option<&mut Pair> {
        match self {
            Postgres::Two(p) => Some(p),
            Postgres::One(_) => None,
        }
    }
}

/// A pool on `url` that follows the primary when it names several hosts (the library's own
/// `follow_primary`, as the daemon does).
pub async fn connect(url: &str, max: u32) -> anyhow::Result<PgPool> {
    use txoutbox::store::postgres::hosts::{follow_primary, HostList};
    let hosts = HostList::from_url(url).context("the run's database URL")?;
    let opts = hosts.find().await.context("find the primary")?;
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(max)
        .acquire_timeout(Duration::from_secs(5))
        .connect_lazy_with(opts);
    tokio::spawn(follow_primary(pool.clone(), hosts));
    Ok(pool)
}

const NAMES: [&str; 2] = ["a", "b"];

/// The physical slot (and `application_name`) of node `i` when it is the standby.
fn slot_of(i: usize) -> String {
    format!("chaos_standby_{}", NAMES[i])
}

/// One failover, for the report.
pub struct Promotion {
    /// The node promoted.
    pub node: &'static str,
    pub at: SystemTime,
    /// Since the start of the run.
    pub offset: Duration,
    /// From the kill to the end of `pg_ctl promote`.
    pub took: Duration,
    /// Every event with a `seq` above this was committed on the new primary.
    pub seq_above: i64,
    /// What became of the relays' slot (WAL runs).
    pub slot: String,
    /// When the new standby streamed, since the promotion (set by the rebuild).
    pub standby_after: Arc<Mutex<Option<Duration>>>,
}

pub struct Pair {
    nodes: [Arc<PgCluster>; 2],
    /// Which node is the primary.
    primary: usize,
    major: u32,
    logical: bool,
    /// The standby being made (in the background), if one is.
    rebuild: Option<JoinHandle<()>>,
    pub promotions: Vec<Promotion>,
    started: Instant,
}

impl Drop for Pair {
    fn drop(&mut self) {
        if let Some(r) = self.rebuild.take() {
            r.abort();
        }
    }
}

/// The major version of the server programs in `bin` ("postgres (PostgreSQL) 17.10").
pub fn major(bin: &Path) -> anyhow::Result<u32> {
    let out = std::process::Command::new(bin.join("postgres"))
        .arg("--version")
        .output()
        .with_context(|| format!("run {}/postgres --version", bin.display()))?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.split_whitespace()
        .last()
        .and_then(|v| v.split('.').next())
        .and_then(|m| m.parse().ok())
        .with_context(|| format!("read the major version from {text:?}"))
}

impl Pair {
    async fn start(bin: &Path, root: &Path, logical: bool) -> anyhow::Result<Self> {
        let major = major(bin)?;
        let ports = [free_port()?, free_port()?];
        let nodes = [0, 1].map(|i| {
            let other = ports[1 - i];
            // What a standby needs; a primary ignores them. A dbname: on 17+ the slot sync
            // worker connects to a database. Reconnecting within 0.5 s (not 5): commits wait
            // for the standby, also after a `pg-restart` of the primary.
            let mut extra = format!(
                "-c \"primary_conninfo=host=127.0.0.1 port={other} user=postgres dbname=postgres \
                 application_name={slot}\" -c primary_slot_name={slot} -c hot_standby_feedback=on \
                 -c wal_retrieve_retry_interval=500ms",
                slot = slot_of(i)
            );
            if major >= 17 {
                extra.push_str(" -c sync_replication_slots=on");
            }
            Arc::new(PgCluster::node(
                bin,
                root.join(format!("pg-{}", NAMES[i])),
                root.join(format!("pg-{}.log", NAMES[i])),
                ports[i],
                logical,
                extra,
            ))
        });
        if nodes[0].as_postgres() {
            chown_to_postgres(root)?;
        }
        nodes[0].initdb()?;
        nodes[0].start_server().await?;
        let mut me = Self {
            nodes,
            primary: 0,
            major,
            logical,
            rebuild: None,
            promotions: Vec::new(),
            started: Instant::now(),
        };
        // The first standby, before the run starts.
        make_standby(&me.nodes[0], &me.nodes[1], 1, major).await?;
        me.started = Instant::now();
        Ok(me)
    }

    fn url(&self) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{},127.0.0.1:{}/postgres?target_session_attrs=read-write",
            self.nodes[0].port(),
            self.nodes[1].port()
        )
    }

    /// Is a new standby being made (its slot not streaming yet)?
    pub fn rebuilding(&self) -> bool {
        self.rebuild.as_ref().is_some_and(|r| !r.is_finished())
    }

    /// Can the standby take over now: made, streaming, and on 17+ holding a usable copy of
    /// each of the primary's failover slots. `Err` says what it waits for.
    pub async fn ready(&self) -> Result<(), String> {
        if self.rebuilding() {
            return Err("being made".into());
        }
        let standby = 1 - self.primary;
        let mut p = PgConnection::connect(&self.nodes[self.primary].url())
            .await
            .map_err(|e| format!("primary: {e}"))?;
        let streaming: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT FROM pg_stat_replication \
             WHERE application_name = $1 AND state = 'streaming')",
        )
        .bind(slot_of(standby))
        .fetch_one(&mut p)
        .await
        .map_err(|e| e.to_string())?;
        if !streaming {
            return Err("not streaming".into());
        }
        if self.major < 17 {
            return Ok(());
        }
        let wanted: Vec<String> = sqlx::query_scalar(
            "SELECT slot_name::text FROM pg_replication_slots WHERE slot_type = 'logical' AND failover",
        )
        .fetch_all(&mut p)
        .await
        .map_err(|e| e.to_string())?;
        let mut s = PgConnection::connect(&self.nodes[standby].url())
            .await
            .map_err(|e| format!("standby: {e}"))?;
        let synced: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_replication_slots \
             WHERE slot_name = ANY($1) AND synced AND NOT temporary",
        )
        .bind(&wanted)
        .fetch_one(&mut s)
        .await
        .map_err(|e| e.to_string())?;
        if synced < wanted.len() as i64 {
            // A copy becomes usable once the primary's slot passes a record of the running
            // transactions (written every 15 s by the server): write one now.
            let _ = sqlx::query("SELECT pg_log_standby_snapshot()")
                .execute(&mut p)
                .await;
            return Err(format!(
                "{synced} of {} failover slots synchronized",
                wanted.len()
            ));
        }
        Ok(())
    }

    /// Kill the primary, promote the standby, and start making a new standby of the old
    /// node. The caller has checked [`Self::ready`].
    pub async fn failover(&mut self) -> anyhow::Result<&Promotion> {
        let (old, new) = (self.primary, 1 - self.primary);
        let t0 = Instant::now();
        self.nodes[old].kill().context("kill the primary")?;
        self.nodes[new].promote().context("promote the standby")?;
        let took = t0.elapsed();
        let at = SystemTime::now();
        self.primary = new;
        let mut c = PgConnection::connect(&self.nodes[new].url())
            .await
            .context("connect to the new primary")?;
        // A promoted standby's sequences stand at or past every value the old primary handed
        // out (they are logged ahead): above this, an event was committed on the new primary.
        let seq_above: i64 = sqlx::query_scalar(
            "SELECT coalesce(pg_sequence_last_value(pg_get_serial_sequence('public.outbox_events', 'seq')::regclass), 0)",
        )
        .fetch_one(&mut c)
        .await
        .context("read the outbox's sequence")?;
        let slot = if !self.logical {
            String::new()
        } else if self.major >= 17 {
            let synced: Vec<String> = sqlx::query_scalar(
                "SELECT slot_name::text FROM pg_replication_slots WHERE slot_type = 'logical' AND synced",
            )
            .fetch_all(&mut c)
            .await
            .context("read the new primary's slots")?;
            format!("the synchronized copy of the relays' slot carried over: {synced:?}")
        } else {
            format!(
                "PostgreSQL {}: no failover slots, the relays' slot is lost (made again; the table path delivers what it held)",
                self.major
            )
        };
        let _ = c.close().await;
        let standby_after = Arc::new(Mutex::new(None));
        let (primary, node, major) = (self.nodes[new].clone(), self.nodes[old].clone(), self.major);
        let (done, from) = (standby_after.clone(), tokio::time::Instant::now());
        self.rebuild = Some(tokio::spawn(async move {
            for attempt in 1.. {
                match make_standby(&primary, &node, old, major).await {
                    Ok(()) => {
                        if let Ok(mut d) = done.lock() {
                            *d = Some(from.elapsed());
                        }
                        eprintln!(
                            "chaos: failover: node {} streams from the new primary again ({:.1?} after the promotion)",
                            NAMES[old],
                            from.elapsed()
                        );
                        return;
                    }
                    Err(e) => {
                        eprintln!(
                            "chaos: failover: making node {} a standby failed (attempt {attempt}: {e:#}); trying again",
                            NAMES[old]
                        );
                        let _ = node.kill();
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                }
            }
        }));
        self.promotions.push(Promotion {
            node: NAMES[new],
            at,
            offset: self.started.elapsed(),
            took,
            seq_above,
            slot,
            standby_after,
        });
        self.promotions
            .last()
            .context("the promotion just recorded")
    }
}

/// Make `node` (stopped, or never started) a streaming standby of `primary`, then make the
/// primary's commits wait for it.
///
/// While there is no standby, the primary's commits must not wait for one (they would hang):
/// `synchronous_standby_names` (and on 17+ `synchronized_standby_slots`, for which logical
/// replication waits) are cleared first and set again once the standby streams. A commit in
/// that window lives on the primary alone; that is safe for the verdict because a failover is
/// not drawn until the standby has caught up (it streams, so it holds those commits), and a
/// `pg-restart` meanwhile crashes and restarts that same node, losing nothing.
async fn make_standby(
    primary: &Arc<PgCluster>,
    node: &Arc<PgCluster>,
    index: usize,
    major: u32,
) -> anyhow::Result<()> {
    let slot = slot_of(index);
    let mut c = PgConnection::connect(&primary.url())
        .await
        .context("connect to the primary")?;
    set_sync(&mut c, major, "").await?;
    // A slot of an earlier attempt (or of the node's earlier life) goes; reserving WAL at
    // once: the standby starts from the backup's checkpoint, and the copy holds no WAL.
    sqlx::query(
        "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1",
    )
    .bind(&slot)
    .execute(&mut c)
    .await
    .context("drop the standby's old slot")?;
    sqlx::query("SELECT pg_create_physical_replication_slot($1, true)")
        .bind(&slot)
        .execute(&mut c)
        .await
        .context("create the standby's slot")?;
    base_backup(&primary.url(), major, primary.data_dir(), node.data_dir()).await?;
    if node.as_postgres() {
        chown_to_postgres(node.data_dir())?;
    }
    let starting = node.clone();
    tokio::task::spawn_blocking(move || {
        tokio::runtime::Handle::current().block_on(starting.start_server())
    })
    .await
    .context("the standby's start")?
    .context("start the standby")?;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let streaming: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT FROM pg_stat_replication \
             WHERE application_name = $1 AND state = 'streaming')",
        )
        .bind(&slot)
        .fetch_one(&mut c)
        .await
        .context("read pg_stat_replication")?;
        if streaming {
            break;
        }
        if Instant::now() > deadline {
            bail!(
                "the standby does not stream after 60 s (see {})",
                log_of(node).display()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    set_sync(&mut c, major, &slot).await?;
    let _ = c.close().await;
    Ok(())
}

fn log_of(node: &PgCluster) -> PathBuf {
    node.data_dir().with_extension("log")
}

/// `synchronous_standby_names` (and on 17+ `synchronized_standby_slots`) on the primary.
async fn set_sync(c: &mut PgConnection, major: u32, slot: &str) -> anyhow::Result<()> {
    let mut settings = vec![format!(
        "ALTER SYSTEM SET synchronous_standby_names = '{slot}'"
    )];
    if major >= 17 {
        settings.push(format!(
            "ALTER SYSTEM SET synchronized_standby_slots = '{slot}'"
        ));
    }
    settings.push("SELECT pg_reload_conf()".into());
    for sql in settings {
        sqlx::query(&sql)
            .execute(&mut *c)
            .await
            .with_context(|| format!("{sql} on the primary"))?;
    }
    Ok(())
}

/// One line per promotion: how long the promotion took, when delivery resumed (the first
/// event committed on the new primary seen going to the broker: `sends` are the broker taps'
/// records, `seq_of` an event's `seq`), when the new standby streamed, and the slot's fate.
pub fn report(
    promotions: &[Promotion],
    sends: &[(String, SystemTime)],
    seq_of: impl Fn(&str) -> Option<i64>,
) -> Vec<String> {
    promotions
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let resumed = sends
                .iter()
                .filter(|(id, at)| *at >= p.at && seq_of(id).is_some_and(|s| s > p.seq_above))
                .filter_map(|(_, at)| at.duration_since(p.at).ok())
                .min();
            let resumed = match resumed {
                Some(d) => format!("delivery resumed {d:.2?} after the promotion"),
                None => "no event committed on the new primary was delivered".into(),
            };
            let standby = match p.standby_after.lock().ok().and_then(|d| *d) {
                Some(d) => format!("new standby streaming {d:.1?} after"),
                None => "no new standby by the end".into(),
            };
            let slot = if p.slot.is_empty() {
                String::new()
            } else {
                format!("; {}", p.slot)
            };
            format!(
                "failover {}: node {} promoted at +{:.1?} ({:.2?} from the kill); {resumed}; {standby}{slot}",
                i + 1,
                p.node,
                p.offset,
                p.took
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn delivery_resumes_at_the_first_send_of_an_event_committed_on_the_new_primary() {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
        let at = |ms| t0 + Duration::from_millis(ms);
        let p = Promotion {
            node: "b",
            at: t0,
            offset: Duration::from_secs(20),
            took: Duration::from_millis(300),
            seq_above: 100,
            slot: String::new(),
            standby_after: Arc::new(Mutex::new(Some(Duration::from_millis(900)))),
        };
        let sends = vec![
            (
                "old-before".to_string(),
                at(0).checked_sub(Duration::from_millis(5)).unwrap(),
            ),
            // An event of the old primary, sent again after the promotion: not a resumption.
            ("old-after".to_string(), at(200)),
            ("new-late".to_string(), at(1_500)),
            ("new-first".to_string(), at(700)),
            ("unknown".to_string(), at(300)),
        ];
        let seq_of = |id: &str| match id {
            "old-before" | "old-after" => Some(90),
            "new-first" | "new-late" => Some(101),
            _ => None,
        };
        let lines = report(std::slice::from_ref(&p), &sends, seq_of);
        assert_eq!(lines.len(), 1);
        assert!(
            lines[0].contains("delivery resumed 700.00ms after"),
            "{}",
            lines[0]
        );
        assert!(
            lines[0].contains("node b promoted at +20.0s"),
            "{}",
            lines[0]
        );
        assert!(lines[0].contains("streaming 900.0ms after"), "{}", lines[0]);
        let none = report(std::slice::from_ref(&p), &sends[..2], seq_of);
        assert!(
            none[0].contains("no event committed on the new primary"),
            "{}",
            none[0]
        );
    }
}
