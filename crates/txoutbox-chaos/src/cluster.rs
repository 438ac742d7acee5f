//! The run's own PostgreSQL cluster and NATS server, in a temporary directory, on free ports,
//! so that restarting them disturbs nobody else. Both are stopped and removed on drop (also
//! when the run fails or is interrupted).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{bail, Context};

/// A free TCP port on loopback (free when asked; good enough for a test harness).
pub fn free_port() -> anyhow::Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").context("bind a free port")?;
    Ok(l.local_addr().context("local address")?.port())
}

/// Wait until something accepts connections on `port`.
async fn wait_listening(port: u16, what: &str, secs: u64) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    loop {
        if tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
        {
            return Ok(());
        }
        if tokio::time::Instant::now() > deadline {
            bail!("{what} did not start listening on 127.0.0.1:{port} within {secs}s");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub(crate) fn running_as_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

/// A PostgreSQL cluster of our own: initdb'd into `dir`, trust auth, loopback only. (The
/// `failover` fault runs two of them, a primary and a standby: see `failover.rs`.)
pub struct PgCluster {
    bin: PathBuf,
    dir: PathBuf,
    /// The server's log (outside `dir` for a node of a pair, whose directory is made again).
    log: PathBuf,
    port: u16,
    /// PostgreSQL refuses to run as root: then every command runs as the `postgres` user.
    as_postgres: bool,
    /// Started with `wal_level=logical`, for relays that read the WAL.
    logical: bool,
    /// More `-o` options of the server (a standby's settings).
    extra: String,
}

impl PgCluster {
    /// initdb and start. `bin`: the directory with initdb and pg_ctl. `logical`: with
    /// `wal_level=logical` and room for the relays' replication slot and connections.
    pub async fn start(bin: &Path, root: &Path, logical: bool) -> anyhow::Result<Self> {
        let dir = root.join("pg");
        std::fs::create_dir_all(&dir).context("create the PostgreSQL directory")?;
        let as_postgres = running_as_root();
        if as_postgres {
            chown_to_postgres(root)?;
        }
        let me = Self {
            bin: bin.to_path_buf(),
            log: dir.join("server.log"),
            dir,
            port: free_port()?,
            as_postgres,
            logical,
            extra: String::new(),
        };
        me.initdb()?;
        me.pg_ctl(&["start"])?;
        wait_listening(me.port, "PostgreSQL", 30).await?;
        Ok(me)
    }

    /// A node that is not made yet: `dir` (its data directory) is made by [`Self::initdb`]
    /// or copied from a primary; `extra`: more server options.
    pub fn node(
        bin: &Path,
        dir: PathBuf,
        log: PathBuf,
        port: u16,
        logical: bool,
        extra: String,
    ) -> Self {
        Self {
            bin: bin.to_path_buf(),
            dir,
            log,
            port,
            as_postgres: running_as_root(),
            logical,
            extra,
        }
    }

    pub fn data_dir(&self) -> &Path {
        &self.dir
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn as_postgres(&self) -> bool {
        self.as_postgres
    }

    pub fn initdb(&self) -> anyhow::Result<()> {
        let dir = self.dir.display().to_string();
        self.run(
            "initdb",
            &[
                "-D",
                &dir,
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-sync",
            ],
        )
    }

    /// Start it and wait until it listens (`pg_ctl -w`: a standby once it is consistent).
    pub async fn start_server(&self) -> anyhow::Result<()> {
        self.pg_ctl(&["start"])?;
        wait_listening(self.port, "PostgreSQL", 60).await
    }

    /// Kill it: an immediate stop, as a crash (no shutdown checkpoint).
    pub fn kill(&self) -> anyhow::Result<()> {
        self.pg_ctl(&["stop", "-m", "immediate"])
    }

    /// Promote a standby; returns once it is a primary (`pg_ctl promote -w`).
    pub fn promote(&self) -> anyhow::Result<()> {
        self.pg_ctl(&["promote"])
    }

    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// Crash it (immediate shutdown: no checkpoint, crash recovery on start) and start again.
    pub async fn restart(&self) -> anyhow::Result<()> {
        self.pg_ctl(&["stop", "-m", "immediate"])?;
        self.pg_ctl(&["start"])?;
        wait_listening(self.port, "PostgreSQL", 60).await
    }

    fn pg_ctl(&self, args: &[&str]) -> anyhow::Result<()> {
        let mut opts = format!(
            "-c listen_addresses=127.0.0.1 -p {} -c unix_socket_directories={} -c max_connections=200 -c fsync=off",
            self.port,
            self.dir.display()
        );
        if self.logical {
            // initdb's pg_hba already trusts replication connections from loopback.
            opts.push_str(
                " -c wal_level=logical -c max_replication_slots=16 -c max_wal_senders=16",
            );
        }
        if !self.extra.is_empty() {
            opts.push(' ');
            opts.push_str(&self.extra);
        }
        let dir = self.dir.display().to_string();
        let log = self.log.display().to_string();
        let mut all = vec!["-D", &dir, "-l", &log, "-w", "-t", "60", "-o", &opts];
        all.extend_from_slice(args);
        self.run("pg_ctl", &all)
    }

    fn run(&self, tool: &str, args: &[&str]) -> anyhow::Result<()> {
        let exe = self.bin.join(tool);
        let mut c = if self.as_postgres {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(&exe);
            c
        } else {
            Command::new(&exe)
        };
        let out = c
            .args(args)
            .stdin(Stdio::null())
            .output()
            .with_context(|| format!("run {}", exe.display()))?;
        if !out.status.success() {
            bail!(
                "{tool} {} failed: {}{}",
                args.join(" "),
                String::from_utf8_lossy(&out.stdout).trim(),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(())
    }
}

/// `chown -R postgres: path` (PostgreSQL refuses to run as root: then it runs as `postgres`).
pub fn chown_to_postgres(path: &Path) -> anyhow::Result<()> {
    let ok = Command::new("chown")
        .args(["-R", "postgres:"])
        .arg(path)
        .status()
        .context("chown the run directory to postgres")?
        .success();
    if !ok {
        bail!(
            "chown {} to postgres failed (is there a postgres user?)",
            path.display()
        );
    }
    Ok(())
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        let _ = self.pg_ctl(&["stop", "-m", "immediate"]);
    }
}

/// A nats-server with JetStream, its store in `dir`.
pub struct NatsServer {
    exe: PathBuf,
    dir: PathBuf,
    port: u16,
    child: Option<std::process::Child>,
}

impl NatsServer {
    pub async fn start(exe: &Path, root: &Path) -> anyhow::Result<Self> {
        let dir = root.join("nats");
        std::fs::create_dir_all(&dir).context("create the NATS directory")?;
        let mut me = Self {
            exe: exe.to_path_buf(),
            dir,
            port: free_port()?,
            child: None,
        };
        me.spawn().await?;
        Ok(me)
    }

    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    async fn spawn(&mut self) -> anyhow::Result<()> {
        let log = self.dir.join("nats.log");
        let child = Command::new(&self.exe)
            .args([
                "-a",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-js",
                "-sd",
            ])
            .arg(&self.dir)
            .arg("-l")
            .arg(&log)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("start {}", self.exe.display()))?;
        self.child = Some(child);
        wait_listening(self.port, "nats-server", 30).await
    }

    /// Stop it (SIGTERM: JetStream flushes its store, as on a clean broker restart) and start
    /// it again on the same port and store.
    pub async fn restart(&mut self) -> anyhow::Result<()> {
        self.stop();
        self.spawn().await
    }

    fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = Command::new("kill")
                .args(["-TERM", &c.id().to_string()])
                .status();
            for _ in 0..200 {
                if let Ok(Some(_)) = c.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(25));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        self.stop();
    }
}
