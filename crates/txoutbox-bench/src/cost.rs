//! What a drain costs the database, counted rather than timed (`--costs`): the bytes and the
//! round trips on the wire between the relay and PostgreSQL, and the WAL the drain wrote. The
//! counts depend on the SQL and the schema, not on how busy the machine is, so a stored
//! baseline with a threshold (`--check-costs`) is a regression gate that a shared CI machine
//! can run: the speed lost since `78ab07f` came from a claim that sent its fence on every row
//! (bytes from the database) and a settle that paid for one more index (WAL).
//!
//! The relays reach PostgreSQL through [`WireMeter`], a TCP proxy in this process that counts
//! both directions and the frontend's `Sync` and `Query` messages: the round trips (the client
//! waits for the server's answer to each; a statement is one, its first preparation on a
//! connection another, and so is sqlx's ping of a pooled connection). It also tallies the
//! statements run (`Bind` of a prepared text, or `Query`) by their text.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use anyhow::Context;
use serde::{Deserialize, Serialize};
use sqlx::postgres::PgConnectOptions;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

use crate::report::Row;

/// The cost columns of a drain row, per event (round trips per 1,000 events).
pub const METRICS: &[&str] = &[
    "db_bytes_in_per_event",
    "db_bytes_out_per_event",
    "round_trips_per_1k",
    "wal_bytes_per_event",
];

/// Default threshold of `--check-costs`: a count more than this fraction over its baseline
/// fails.
pub const DEFAULT_THRESHOLD: f64 = 0.10;

/// Counts of one proxy, over all its connections.
#[derive(Debug, Default)]
struct Counters {
    to_db: AtomicU64,
    from_db: AtomicU64,
    round_trips: AtomicU64,
    /// Executions per statement text (its start: [`TEXT_PREFIX`] bytes).
    texts: std::sync::Mutex<BTreeMap<String, u64>>,
}

/// How much of a statement's text names it in [`WireMeter::statements`].
const TEXT_PREFIX: usize = 160;

/// A snapshot of the counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Wire {
    /// Bytes from the relay to PostgreSQL.
    pub to_db: u64,
    /// Bytes from PostgreSQL to the relay.
    pub from_db: u64,
    /// `Sync` and `Query` messages from the relay: round trips.
    pub round_trips: u64,
}

/// A counting TCP proxy in front of PostgreSQL, for the relays of one run.
pub struct WireMeter {
    addr: SocketAddr,
    counters: Arc<Counters>,
    task: JoinHandle<()>,
}

impl WireMeter {
    /// Listen on a free loopback port and forward every connection to the server of
    /// `database_url`.
    pub async fn start(database_url: &str) -> anyhow::Result<Self> {
        let opts = PgConnectOptions::from_str(database_url).context("--costs: database URL")?;
        let upstream = format!("{}:{}", opts.get_host(), opts.get_port());
        if upstream.starts_with('/') {
            anyhow::bail!("--costs needs PostgreSQL over TCP, not a Unix socket ({upstream})");
        }
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .context("--costs: listening for the relays")?;
        let addr = listener.local_addr()?;
        let counters = Arc::new(Counters::default());
        let c = counters.clone();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let (c, upstream) = (c.clone(), upstream.clone());
                tokio::spawn(async move {
                    if let Ok(server) = TcpStream::connect(&upstream).await {
                        forward(client, server, c).await;
                    }
                });
            }
        });
        Ok(Self {
            addr,
            counters,
            task,
        })
    }

    /// `database_url` pointed at this proxy, without TLS (a proxy cannot read TLS records:
    /// the statement count needs plain messages, and TLS framing would count as bytes).
    pub fn url(&self, database_url: &str) -> anyhow::Result<String> {
        let mut u = url::Url::parse(database_url).context("--costs: database URL")?;
        u.set_host(Some(&self.addr.ip().to_string()))
            .context("--costs: database URL")?;
        u.set_port(Some(self.addr.port()))
            .map_err(|()| anyhow::anyhow!("--costs: database URL has no port to set"))?;
        let kept: Vec<(String, String)> = u
            .query_pairs()
            .filter(|(k, _)| k != "sslmode" && k != "host" && k != "port")
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect();
        u.query_pairs_mut()
            .clear()
            .extend_pairs(kept)
            .append_pair("sslmode", "disable");
        Ok(u.into())
    }

    /// Each distinct statement the relays ran (the start of its text, whitespace folded)
    /// and how many times, most frequent first.
    pub fn statements(&self) -> Vec<(String, u64)> {
        let mut v: Vec<(String, u64)> = self
            .counters
            .texts
            .lock()
            .map(|t| t.iter().map(|(k, n)| (k.clone(), *n)).collect())
            .unwrap_or_default();
        v.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        v
    }

    pub fn read(&self) -> Wire {
        Wire {
            to_db: self.counters.to_db.load(Ordering::Relaxed),
            from_db: self.counters.from_db.load(Ordering::Relaxed),
            round_trips: self.counters.round_trips.load(Ordering::Relaxed),
        }
    }
}

impl Drop for WireMeter {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Copy both ways until either side closes, counting.
async fn forward(client: TcpStream, server: TcpStream, c: Arc<Counters>) {
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (mut cr, mut cw) = client.into_split();
    let (mut sr, mut sw) = server.into_split();
    let up = {
        let c = c.clone();
        async move {
            let mut frames = Frontend::default();
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                let n = match cr.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => n,
                };
                c.to_db.fetch_add(n as u64, Ordering::Relaxed);
                c.round_trips
                    .fetch_add(frames.feed(&buf[..n]), Ordering::Relaxed);
                if !frames.ran.is_empty() {
                    if let Ok(mut t) = c.texts.lock() {
                        for text in frames.ran.drain(..) {
                            *t.entry(text).or_default() += 1;
                        }
                    }
                }
                if sw.write_all(&buf[..n]).await.is_err() {
                    break;
                }
            }
            let _ = sw.shutdown().await;
        }
    };
    let down = async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match sr.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            c.from_db.fetch_add(n as u64, Ordering::Relaxed);
            if cw.write_all(&buf[..n]).await.is_err() {
                break;
            }
        }
        let _ = cw.shutdown().await;
    };
    tokio::join!(up, down);
}

/// The frontend's side of PostgreSQL's protocol, read only as far as message boundaries: the
/// start-up packet (no type byte, and `SSLRequest`/`GSSENCRequest` before it) and then typed
/// messages, of which `S` (Sync) and `Q` (Query) are counted.
#[derive(Debug, Default)]
struct Frontend {
    typed: bool,
    header: Vec<u8>,
    skip: usize,
    /// The type of the message being read, and the start of its body (`P`, `B`, `Q`).
    kind: u8,
    body: Vec<u8>,
    /// This connection's prepared statements: name -> text.
    prepared: std::collections::HashMap<Vec<u8>, String>,
    /// Texts of the statements run since the counters last took them.
    ran: Vec<String>,
}

/// The `i`th NUL-terminated string of a message body (the last may be cut short: only the
/// start of a body is kept).
fn cstr(body: &[u8], i: usize) -> Option<&[u8]> {
    body.split(|b| *b == 0).nth(i)
}

/// A statement's text for the tally: the start, whitespace folded.
fn fold(text: &[u8]) -> String {
    let t = String::from_utf8_lossy(text);
    let folded = t.split_whitespace().collect::<Vec<_>>().join(" ");
    folded.chars().take(TEXT_PREFIX).collect()
}

/// `SSLRequest` and `GSSENCRequest`: the start-up packet comes after them.
const ENCRYPTION_REQUESTS: [u32; 2] = [80_877_103, 80_877_104];

impl Frontend {
    /// Read `data`; returns the round trips that ended in it (`Sync`, `Query`).
    fn feed(&mut self, mut data: &[u8]) -> u64 {
        let mut counted = 0;
        while !data.is_empty() {
            if self.skip > 0 {
                let n = self.skip.min(data.len());
                if matches!(self.kind, b'P' | b'B' | b'Q') {
                    let room = (4 * TEXT_PREFIX).saturating_sub(self.body.len());
                    self.body.extend_from_slice(&data[..n.min(room)]);
                }
                self.skip -= n;
                data = &data[n..];
                if self.skip == 0 {
                    self.message_read();
                }
                continue;
            }
            let need = if self.typed { 5 } else { 8 };
            let n = (need - self.header.len()).min(data.len());
            self.header.extend_from_slice(&data[..n]);
            data = &data[n..];
            if self.header.len() < need {
                break;
            }
            let at = usize::from(self.typed);
            let len = u32::from_be_bytes([
                self.header[at],
                self.header[at + 1],
                self.header[at + 2],
                self.header[at + 3],
            ]) as usize;
            if self.typed {
                if matches!(self.header[0], b'S' | b'Q') {
                    counted += 1;
                }
                self.kind = self.header[0];
                self.body.clear();
                self.skip = len.saturating_sub(4);
                if self.skip == 0 {
                    self.message_read();
                }
            } else {
                let code = u32::from_be_bytes([
                    self.header[4],
                    self.header[5],
                    self.header[6],
                    self.header[7],
                ]);
                // The start-up packet proper is followed by typed messages; a request for
                // encryption by another start-up packet (the server answered `N`).
                self.typed = !ENCRYPTION_REQUESTS.contains(&code);
                self.kind = 0;
                self.skip = len.saturating_sub(8);
            }
            self.header.clear();
        }
        counted
    }
}

impl Frontend {
    /// A whole message was read: a `Parse` names a statement, a `Bind` runs one, a `Query` is
    /// one.
    fn message_read(&mut self) {
        match self.kind {
            b'P' => {
                if let (Some(name), Some(text)) = (cstr(&self.body, 0), cstr(&self.body, 1)) {
                    self.prepared.insert(name.to_vec(), fold(text));
                }
            }
            b'B' => {
                if let Some(name) = cstr(&self.body, 1) {
                    let text = self.prepared.get(name).cloned();
                    self.ran
                        .push(text.unwrap_or_else(|| "(unknown statement)".into()));
                }
            }
            b'Q' => {
                if let Some(text) = cstr(&self.body, 0) {
                    self.ran.push(fold(text));
                }
            }
            _ => {}
        }
        self.kind = 0;
    }
}

/// Where the server's WAL insert position is now.
pub async fn wal_position(pool: &sqlx::PgPool) -> anyhow::Result<i64> {
    sqlx::query_scalar("SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')::int8")
        .fetch_one(pool)
        .await
        .context("--costs: reading the WAL position")
}

/// The stored baseline of `--check-costs`: per configuration (the row's name), per metric.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Baseline {
    /// How far over its baseline a count may go: 0.10 = 10%.
    pub threshold: f64,
    pub configurations: BTreeMap<String, BTreeMap<String, f64>>,
}

impl Baseline {
    pub fn read(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("--check-costs: reading {}", path.display()))?;
        let b: Self = serde_json::from_str(&text)
            .with_context(|| format!("--check-costs: {} is not a cost baseline", path.display()))?;
        if !(b.threshold.is_finite() && b.threshold >= 0.0) {
            anyhow::bail!(
                "--check-costs: {}: threshold must be a non-negative number, not {}",
                path.display(),
                b.threshold
            );
        }
        Ok(b)
    }

    /// The medians of `rows`' cost columns, as a new baseline.
    pub fn from_rows(rows: &[Row], threshold: f64) -> Self {
        let configurations = rows
            .iter()
            .map(|r| {
                let m = METRICS
                    .iter()
                    .filter_map(|m| r.stat(m).map(|s| ((*m).to_string(), s.median)))
                    .collect();
                (r.config.clone(), m)
            })
            .collect();
        Self {
            threshold,
            configurations,
        }
    }

    /// Every count of `rows` over its baseline by more than the threshold, and every
    /// configuration the baseline does not know, as one line each.
    pub fn check(&self, rows: &[Row]) -> Vec<String> {
        let mut failures = Vec::new();
        for r in rows {
            let Some(base) = self.configurations.get(&r.config) else {
                failures.push(format!(
                    "{}: not in the baseline (write one with --write-costs)",
                    r.config
                ));
                continue;
            };
            for m in METRICS {
                let (Some(now), Some(was)) = (r.stat(m).map(|s| s.median), base.get(*m)) else {
                    continue;
                };
                if now > was * (1.0 + self.threshold) {
                    failures.push(format!(
                        "{}: {m} {now:.1} is {:+.1}% over the baseline's {was:.1} (threshold \
                         {:.0}%)",
                        r.config,
                        (now / was - 1.0) * 100.0,
                        self.threshold * 100.0
                    ));
                }
            }
        }
        failures
    }

    pub fn write(&self, path: &Path) -> anyhow::Result<()> {
        let text = serde_json::to_string_pretty(self)? + "\n";
        std::fs::write(path, text)
            .with_context(|| format!("--write-costs: writing {}", path.display()))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn message(kind: u8, body: &[u8]) -> Vec<u8> {
        let mut m = vec![kind];
        m.extend_from_slice(&(body.len() as u32 + 4).to_be_bytes());
        m.extend_from_slice(body);
        m
    }

    fn startup(code: u32, body: &[u8]) -> Vec<u8> {
        let mut m = (body.len() as u32 + 8).to_be_bytes().to_vec();
        m.extend_from_slice(&code.to_be_bytes());
        m.extend_from_slice(body);
        m
    }

    #[test]
    fn round_trips_and_statements_are_counted_across_any_split_of_the_stream() {
        let mut stream = startup(80_877_103, b""); // SSLRequest, refused
        stream.extend(startup(196_608, b"user\0postgres\0\0"));
        stream.extend(message(b'p', b"password"));
        stream.extend(message(b'Q', b"BEGIN\0"));
        // Bodies that hold bytes which look like message types.
        stream.extend(message(b'P', b"s1\0SELECT  'S'\n  Q\0\0\0"));
        stream.extend(message(b'S', b""));
        let mut bind = b"\0s1\0".to_vec();
        bind.extend([b'S'; 3000]);
        for _ in 0..2 {
            stream.extend(message(b'B', &bind));
            stream.extend(message(b'E', b"\0\0\0\0\0"));
            stream.extend(message(b'S', b""));
        }
        stream.extend(message(b'd', &[b'Q'; 70_000]));
        stream.extend(message(b'Q', b"COMMIT\0"));
        stream.extend(message(b'X', b""));
        for chunk in [1, 2, 3, 5, 7, 64, 4096, stream.len()] {
            let mut f = Frontend::default();
            let n: u64 = stream.chunks(chunk).map(|c| f.feed(c)).sum();
            assert_eq!(n, 5, "chunks of {chunk}");
            assert_eq!(
                f.ran,
                ["BEGIN", "SELECT 'S' Q", "SELECT 'S' Q", "COMMIT"],
                "chunks of {chunk}"
            );
        }
    }

    fn row(name: &str, values: &[(&'static str, f64)]) -> Row {
        let mut r = crate::report::RunResult::default();
        for (k, v) in values {
            r = r.value(k, *v);
        }
        Row::new(name.into(), serde_json::json!({}), &[r])
    }

    #[test]
    fn a_count_over_its_threshold_fails_and_one_within_passes() {
        let base = Baseline::from_rows(
            &[row(
                "a",
                &[
                    ("db_bytes_in_per_event", 400.0),
                    ("wal_bytes_per_event", 1000.0),
                ],
            )],
            0.10,
        );
        let within = row(
            "a",
            &[
                ("db_bytes_in_per_event", 439.0),
                ("wal_bytes_per_event", 900.0),
            ],
        );
        assert!(base.check(&[within]).is_empty());
        let over = row(
            "a",
            &[
                ("db_bytes_in_per_event", 441.0),
                ("wal_bytes_per_event", 1000.0),
            ],
        );
        let failures = base.check(&[over]);
        assert_eq!(failures.len(), 1, "{failures:?}");
        assert!(
            failures[0].contains("db_bytes_in_per_event"),
            "{failures:?}"
        );
        let unknown = base.check(&[row("b", &[("db_bytes_in_per_event", 1.0)])]);
        assert!(unknown[0].contains("not in the baseline"), "{unknown:?}");
    }

    #[tokio::test]
    async fn the_url_points_at_the_proxy_without_tls() {
        let meter = WireMeter::start(
            "postgres://u:p@db.example:6543/app?sslmode=require&application_name=x",
        )
        .await
        .unwrap();
        let url = meter
            .url("postgres://u:p@db.example:6543/app?sslmode=require&application_name=x")
            .unwrap();
        let port = meter.addr.port();
        assert_eq!(
            url,
            format!("postgres://u:p@127.0.0.1:{port}/app?application_name=x&sslmode=disable")
        );
    }
}
