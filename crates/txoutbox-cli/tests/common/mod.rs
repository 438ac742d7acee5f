//! Support for the CLI tests: a fresh schema per test (the library's PostgreSQL harness), the
//! real binary, real brokers.
#![allow(dead_code, clippy::unwrap_used)]

use std::process::{Output, Stdio};
use std::time::Duration;

use tokio::process::{Child, Command};
pub use txoutbox::testing::postgres::database_url;
use txoutbox::testing::postgres::PgHarness;
use txoutbox::testing::Harness;

pub fn nats_url() -> String {
    std::env::var("NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".into())
}
pub fn amqp_url() -> String {
    std::env::var("AMQP_URL").unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into())
}

pub fn unique(prefix: &str) -> String {
    format!(
        "{prefix}_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    )
}

/// A schema of its own in the test database: the library's PostgreSQL harness
/// (`txoutbox::testing::postgres::PgHarness`, whose `pool` and `schema` it derefs to),
/// dropped by `cleanup` or, should the test panic first, on drop.
pub struct TestSchema(PgHarness);

impl std::ops::Deref for TestSchema {
    type Target = PgHarness;
    fn deref(&self) -> &PgHarness {
        &self.0
    }
}

impl TestSchema {
    /// A fresh, empty schema name (not yet migrated).
    pub async fn new() -> Self {
        Self(PgHarness::unmigrated().await)
    }

    /// A fresh schema, migrated with the binary.
    pub async fn migrated() -> Self {
        let s = Self::new().await;
        let out = s.cli(&["migrate"]).await;
        assert!(out.status.success(), "migrate failed: {}", stderr(&out));
        s
    }

    pub fn table(&self) -> String {
        self.0.table.qualified()
    }

    /// The binary with DATABASE_URL and TXOUTBOX_SCHEMA set for this test.
    pub fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_txoutbox"));
        c.args(args)
            .env("DATABASE_URL", database_url())
            .env("TXOUTBOX_SCHEMA", &self.schema)
            .env_remove("TXOUTBOX_TABLE")
            .env_remove("TXOUTBOX_PUBLISHER")
            .env_remove("TXOUTBOX_CONFIG")
            .env_remove("TXOUTBOX_RETENTION_PERIOD")
            // Tests that want the admin listener pass --admin-addr with a free port.
            .env("TXOUTBOX_ADMIN_ADDR", "off")
            .env_remove("TXOUTBOX_ADMIN_TOKEN")
            .env("TXOUTBOX_LOG", "info")
            .stdin(Stdio::null())
            .kill_on_drop(true);
        c
    }

    pub async fn cli(&self, args: &[&str]) -> Output {
        tokio::time::timeout(Duration::from_secs(120), self.command(args).output())
            .await
            .expect("command timed out")
            .expect("run txoutbox")
    }

    /// [`TestSchema::cli`] with `env` set too.
    pub async fn cli_env(&self, env: &[(&str, &str)], args: &[&str]) -> Output {
        let mut c = self.command(args);
        for (k, v) in env {
            c.env(k, v);
        }
        tokio::time::timeout(Duration::from_secs(120), c.output())
            .await
            .expect("command timed out")
            .expect("run txoutbox")
    }

    /// A relay (or any command) in the background. Its stderr goes to a log file in the temp
    /// directory (a pipe nobody reads would fill up and block it); the path is printed.
    pub fn spawn(&self, args: &[&str]) -> Child {
        let log = std::env::temp_dir().join(format!("{}-{}.log", self.schema, unique("p")));
        let file = std::fs::File::create(&log).expect("create a log file");
        eprintln!("{} logs to {}", args.first().unwrap_or(&""), log.display());
        self.command(args)
            .stdout(Stdio::null())
            .stderr(Stdio::from(file))
            .spawn()
            .expect("spawn txoutbox")
    }

    /// Insert `n` events with the seed's own column list, set-based.
    pub async fn insert_events(&self, n: i64, aggregates: i64) -> Vec<uuid::Uuid> {
        sqlx::query_scalar(&format!(
            "INSERT INTO {} (aggregate_type, aggregate_id, event_type, payload)
             SELECT 'order', (g % $2)::text, 'order.created', jsonb_build_object('n', g)
             FROM generate_series(1, $1) g RETURNING id",
            self.table()
        ))
        .bind(n)
        .bind(aggregates)
        .fetch_all(&self.pool)
        .await
        .expect("insert events")
    }

    pub async fn scalar(&self, sql: &str) -> i64 {
        sqlx::query_scalar(&sql.replace("{t}", &self.table()))
            .fetch_one(&self.pool)
            .await
            .expect(sql)
    }

    pub async fn cleanup(self) {
        self.0.cleanup().await;
    }
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}
pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Poll `f` until it returns true, or fail after `secs`.
pub async fn wait_until<F, Fut>(secs: u64, what: &str, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    loop {
        if f().await {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// One HTTP/1.1 request on a fresh connection: (status, body).
pub async fn http(
    port: u16,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: &str,
) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n{auth}\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).await.unwrap();
    let text = String::from_utf8_lossy(&out).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    // Chunked bodies: good enough to search in; JSON bodies here have a Content-Length.
    (status, body)
}

/// A loopback port free at the time of asking.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// SIGTERM a relay and wait (up to 30 s) for its clean exit.
pub async fn stop(mut child: tokio::process::Child) {
    signal(&child, "TERM");
    let status = tokio::time::timeout(Duration::from_secs(30), child.wait())
        .await
        .expect("relay exits after SIGTERM")
        .unwrap();
    assert!(status.success(), "relay exit: {status}");
}

/// Send a signal to a child process.
pub fn signal(child: &Child, sig: &str) {
    let pid = child.id().expect("child has a pid");
    let ok = std::process::Command::new("kill")
        .args([format!("-{sig}"), pid.to_string()])
        .status()
        .expect("run kill")
        .success();
    assert!(ok, "kill -{sig} {pid} failed");
}

/// A JetStream stream of its own for one test.
pub struct TestStream {
    pub js: async_nats::jetstream::Context,
    pub name: String,
    pub prefix: String,
}

impl TestStream {
    pub async fn new() -> Self {
        let client = async_nats::connect(nats_url()).await.expect("connect NATS");
        let name = unique("TXO").to_uppercase();
        let prefix = unique("txo").to_lowercase();
        Self {
            js: async_nats::jetstream::new(client),
            name,
            prefix,
        }
    }

    /// The publisher URL the relay should use (it creates the stream).
    pub fn publisher_url(&self) -> String {
        format!(
            "{}?stream={}&subject={}.{{aggregate_type}}.{{event_type}}",
            nats_url(),
            self.name,
            self.prefix
        )
    }

    pub async fn count(&self) -> u64 {
        match self.js.get_stream(&self.name).await {
            Ok(mut s) => s.info().await.map(|i| i.state.messages).unwrap_or(0),
            Err(_) => 0,
        }
    }

    /// Every message's `Nats-Msg-Id`, in stream order.
    pub async fn ids(&self) -> Vec<String> {
        let stream = self.js.get_stream(&self.name).await.expect("stream exists");
        let last = stream.cached_info().state.last_sequence;
        let mut ids = Vec::new();
        for seq in 1..=last {
            if let Ok(m) = stream.get_raw_message(seq).await {
                if let Some(id) = m.headers.get("Nats-Msg-Id") {
                    ids.push(id.to_string());
                }
            }
        }
        ids
    }

    pub async fn cleanup(self) {
        let _ = self.js.delete_stream(&self.name).await;
    }
}

/// A TCP relay on a loopback port of its own to the test database's server: a relay given
/// [`DbProxy::url`] loses its database when the test calls [`DbProxy::cut`] (the port closed,
/// every connection through it dropped) and finds it again after [`DbProxy::restore`]. The
/// shared server itself is never stopped.
pub struct DbProxy {
    pub port: u16,
    target: String,
    accept: Option<tokio::task::JoinHandle<()>>,
    conns: std::sync::Arc<std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>>,
}

impl DbProxy {
    pub async fn start() -> Self {
        let target = database_url()
            .split('@')
            .nth(1)
            .and_then(|rest| rest.split('/').next())
            .expect("DATABASE_URL names a host")
            .to_string();
        let mut p = Self {
            port: free_port(),
            target,
            accept: None,
            conns: Default::default(),
        };
        p.restore().await;
        p
    }

    /// DATABASE_URL through the proxy.
    pub fn url(&self) -> String {
        let real = database_url();
        let url = real.replace(&self.target, &format!("127.0.0.1:{}", self.port));
        assert_ne!(url, real);
        url
    }

    /// The database goes away: the port closes and every open connection is dropped.
    pub fn cut(&mut self) {
        if let Some(a) = self.accept.take() {
            a.abort();
        }
        for c in self.conns.lock().unwrap().drain(..) {
            c.abort();
        }
    }

    /// The database answers at the port again.
    pub async fn restore(&mut self) {
        // A listener aborted just now may hold the port for a moment.
        let mut tries = 0;
        let listener = loop {
            match tokio::net::TcpListener::bind(("127.0.0.1", self.port)).await {
                Ok(l) => break l,
                Err(e) if tries < 100 => {
                    tries += 1;
                    let _ = e;
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => panic!("bind the proxy's port {}: {e}", self.port),
            }
        };
        let target = self.target.clone();
        let conns = self.conns.clone();
        self.accept = Some(tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                let target = target.clone();
                let conn = tokio::spawn(async move {
                    if let Ok(mut outbound) = tokio::net::TcpStream::connect(&target).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
                let mut all = conns.lock().unwrap();
                all.retain(|c| !c.is_finished());
                all.push(conn);
            }
        }));
    }
}

impl Drop for DbProxy {
    fn drop(&mut self) {
        self.cut();
    }
}

/// The admin listener on `port` up and its outbox connected: the relay starts its listener
/// before the database answers (and says so on `/readyz` meanwhile).
pub async fn wait_connected(port: u16) {
    wait_until(
        60,
        "the admin listener, its outbox connected",
        || async move {
            if tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_err()
            {
                return false;
            }
            let (_, body) = http(port, "GET", "/readyz", None, "").await;
            serde_json::from_str::<serde_json::Value>(&body).is_ok_and(|v| v["database"] == "ok")
        },
    )
    .await;
}
