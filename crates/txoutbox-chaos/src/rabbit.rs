//! The run's own RabbitMQ node: its own node name, ports, config, database, logs and Erlang
//! cookie, in the run's directory; the shared node on 5672 is never touched.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{bail, Context};
use lapin::options::{ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions};
use lapin::types::FieldTable;
use lapin::{Channel, Connection, ConnectionProperties, ExchangeKind};
use tokio::time::Instant;
use uuid::Uuid;

use crate::cluster::free_port;

/// Erlang boots slowly, more so on a loaded machine (5 s on this 2-core test machine, up to
/// 14 s with a build running beside).
const START_TIMEOUT: Duration = Duration::from_secs(180);

/// A RabbitMQ node of our own, started with the server script itself (Debian's `/usr/sbin`
/// wrapper would switch to the rabbitmq user, who cannot write to the run's directory).
pub struct RabbitNode {
    server: PathBuf,
    ctl: PathBuf,
    dir: PathBuf,
    node: String,
    port: u16,
    dist_port: u16,
    child: Option<Child>,
    /// How long the last start took, until the node answered `await_startup`.
    pub last_start: Duration,
}

impl RabbitNode {
    /// `server`: the `rabbitmq-server` script; `rabbitmqctl` is looked up next to it.
    pub async fn start(server: &Path, root: &Path) -> anyhow::Result<Self> {
        let dir = root.join("rabbitmq");
        std::fs::create_dir_all(dir.join("home")).context("create the RabbitMQ directory")?;
        // Our own (empty) config and plugin list, not the shared node's /etc/rabbitmq.
        std::fs::write(dir.join("rabbitmq.conf"), "").context("write rabbitmq.conf")?;
        std::fs::write(dir.join("enabled_plugins"), "[].\n").context("write enabled_plugins")?;
        let ctl = server.with_file_name("rabbitmqctl");
        let mut me = Self {
            server: server.to_path_buf(),
            ctl: if ctl.exists() {
                ctl
            } else {
                PathBuf::from("rabbitmqctl")
            },
            node: format!(
                "txoutbox-chaos-{}@localhost",
                &Uuid::new_v4().simple().to_string()[..8]
            ),
            port: free_port()?,
            dist_port: free_port()?,
            dir,
            child: None,
            last_start: Duration::ZERO,
        };
        me.spawn().await?;
        Ok(me)
    }

    pub fn url(&self) -> String {
        format!("amqp://guest:guest@127.0.0.1:{}/%2f", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    async fn spawn(&mut self) -> anyhow::Result<()> {
        use std::os::unix::process::CommandExt;
        let started = Instant::now();
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("rabbitmq-server.out"))
            .context("open the RabbitMQ output file")?;
        let err = out.try_clone().context("open the RabbitMQ output file")?;
        let d = &self.dir;
        let child = Command::new(&self.server)
            // Its own Erlang cookie, not root's or the shared node's.
            .env("HOME", d.join("home"))
            .env("RABBITMQ_NODENAME", &self.node)
            .env("RABBITMQ_NODE_IP_ADDRESS", "127.0.0.1")
            .env("RABBITMQ_NODE_PORT", self.port.to_string())
            .env("RABBITMQ_DIST_PORT", self.dist_port.to_string())
            .env("RABBITMQ_CONFIG_FILE", d.join("rabbitmq.conf"))
            .env("RABBITMQ_ENABLED_PLUGINS_FILE", d.join("enabled_plugins"))
            .env("RABBITMQ_MNESIA_BASE", d.join("mnesia"))
            .env("RABBITMQ_LOG_BASE", d.join("log"))
            .env("RABBITMQ_PID_FILE", d.join("rabbitmq.pid"))
            // Its own process group, so that a last-resort kill reaches beam.smp too.
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err))
            .spawn()
            .with_context(|| format!("start {}", self.server.display()))?;
        self.child = Some(child);
        // The AMQP listener opens at the end of the boot; `await_startup` then confirms it.
        self.wait_listening(started).await?;
        self.ctl(&["await_startup", "--timeout", "60"]).await?;
        self.last_start = started.elapsed();
        Ok(())
    }

    /// Wait for the AMQP port, giving up at once if the node exits (a clash, a bad config).
    async fn wait_listening(&mut self, started: Instant) -> anyhow::Result<()> {
        let out = self.dir.join("rabbitmq-server.out");
        while started.elapsed() < START_TIMEOUT {
            if tokio::net::TcpStream::connect(("127.0.0.1", self.port))
                .await
                .is_ok()
            {
                return Ok(());
            }
            if let Some(Ok(Some(status))) = self.child.as_mut().map(|c| c.try_wait()) {
                self.child = None;
                bail!(
                    "rabbitmq-server exited ({status}) before listening on 127.0.0.1:{}; see {}",
                    self.port,
                    out.display()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        bail!(
            "RabbitMQ did not listen on 127.0.0.1:{} within {START_TIMEOUT:?}; see {}",
            self.port,
            out.display()
        )
    }

    /// `rabbitmqctl -n NODE ...`, with the node's cookie (its HOME).
    async fn ctl(&self, args: &[&str]) -> anyhow::Result<()> {
        let out = tokio::process::Command::new(&self.ctl)
            .arg("-n")
            .arg(&self.node)
            .args(args)
            .env("HOME", self.dir.join("home"))
            .stdin(Stdio::null())
            .output()
            .await
            .with_context(|| format!("run {}", self.ctl.display()))?;
        if !out.status.success() {
            bail!(
                "rabbitmqctl {} failed: {}{}",
                args.join(" "),
                String::from_utf8_lossy(&out.stdout).trim(),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(())
    }

    /// Stop the node cleanly (`rabbitmqctl stop`: queues and messages are kept on disk) and
    /// start it again on the same ports and database.
    pub async fn restart(&mut self) -> anyhow::Result<()> {
        self.stop().await;
        self.spawn().await
    }

    async fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        if self.ctl(&["stop"]).await.is_ok() {
            let deadline = Instant::now() + Duration::from_secs(30);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        kill_group(&mut child);
    }
}

/// SIGKILL the process group we started (the script and its beam.smp), and reap.
fn kill_group(child: &mut Child) {
    let _ = Command::new("kill")
        .args(["-KILL", "--", &format!("-{}", child.id())])
        .status();
    let _ = child.kill();
    let _ = child.wait();
}

impl Drop for RabbitNode {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let stopped = std::process::Command::new(&self.ctl)
                .arg("-n")
                .arg(&self.node)
                .arg("stop")
                .env("HOME", self.dir.join("home"))
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if stopped {
                for _ in 0..400 {
                    if let Ok(Some(_)) = child.try_wait() {
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(25));
                }
            }
            kill_group(&mut child);
        }
    }
}

/// Declare what the relays publish to, before they start: the durable topic exchange and the
/// durable queue bound to it with `#` (what the publisher's `bind_queue` declares too; the
/// declarations must be equivalent or the broker refuses them).
pub async fn declare(url: &str, exchange: &str, queue: &str) -> anyhow::Result<()> {
    let conn = Connection::connect(url, ConnectionProperties::default())
        .await
        .context("connect to RabbitMQ")?;
    let ch = conn.create_channel().await.context("open a channel")?;
    ch.exchange_declare(
        exchange.into(),
        ExchangeKind::Topic,
        ExchangeDeclareOptions {
            durable: true,
            ..Default::default()
        },
        FieldTable::default(),
    )
    .await
    .context("declare the exchange")?;
    declare_queue(&ch, queue).await?;
    ch.queue_bind(
        queue.into(),
        exchange.into(),
        "#".into(),
        QueueBindOptions::default(),
        FieldTable::default(),
    )
    .await
    .context("bind the queue")?;
    let _ = conn.close(200, "declared".into()).await;
    Ok(())
}

pub async fn declare_queue(ch: &Channel, queue: &str) -> anyhow::Result<()> {
    ch.queue_declare(
        queue.into(),
        QueueDeclareOptions {
            durable: true,
            ..Default::default()
        },
        FieldTable::default(),
    )
    .await
    .context("declare the queue")?;
    Ok(())
}

/// Messages ready in `queue` (not counting those delivered and not yet acked).
pub async fn ready_messages(url: &str, queue: &str) -> anyhow::Result<u32> {
    let conn = Connection::connect(url, ConnectionProperties::default())
        .await
        .context("connect to RabbitMQ")?;
    let ch = conn.create_channel().await.context("open a channel")?;
    let q = ch
        .queue_declare(
            queue.into(),
            QueueDeclareOptions {
                passive: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
        .context("look the queue up")?;
    let _ = conn.close(200, "done".into()).await;
    Ok(q.message_count())
}
