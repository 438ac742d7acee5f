//! A relay as a child process (`txoutbox relay`), with its peak RSS.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use txoutbox::relay::{Mode, Source};

use crate::UsageError;

/// How often /proc/PID/status is read for VmHWM (the kernel's own high-water mark of the
/// resident set: a sample misses only growth in the last interval before exit).
const RSS_POLL: Duration = Duration::from_millis(20);

/// A `--publisher` value that names a config file with `[[route]]` entries instead of a URL.
pub const ROUTES_PREFIX: &str = "routes:";

/// How long the relay children keep published rows, for either source, unless the bench's
/// environment or a `--relay-arg=--retention-period=...` says otherwise.
pub const KEEP: &str = "7d";

pub struct RelaySpec<'a> {
    /// The `txoutbox` binary.
    pub txoutbox: &'a Path,
    pub database_url: &'a str,
    pub schema: &'a str,
    pub publisher: &'a str,
    pub mode: Mode,
    pub source: Source,
    pub drain: bool,
    pub extra: &'a [String],
}

pub struct RelayChild {
    child: Child,
    pid: u32,
    peak_kib: u64,
    stderr_tail: Arc<Mutex<VecDeque<String>>>,
}

impl RelayChild {
    pub fn spawn(spec: &RelaySpec<'_>) -> anyhow::Result<Self> {
        let mut cmd = Command::new(spec.txoutbox);
        // `routes:PATH`: the relay's publishers are the `[[route]]` entries of that config file.
        match spec.publisher.strip_prefix(ROUTES_PREFIX) {
            Some(path) => cmd.arg("--config").arg(path).arg("relay"),
            None => cmd.arg("relay").arg("--publisher").arg(spec.publisher),
        };
        cmd.arg("--mode").arg(spec.mode.as_str());
        // The table source is the default: a build from before `--source` runs too.
        if spec.source != Source::Table {
            cmd.arg("--source").arg(spec.source.as_str());
        }
        cmd.arg("--admin-addr").arg("off");
        if spec.drain {
            cmd.arg("--drain");
        }
        cmd.args(spec.extra)
            // The URL goes by environment, not argv, so a password is not in `ps`.
            .env("DATABASE_URL", spec.database_url)
            .env("TXOUTBOX_SCHEMA", spec.schema)
            .env("TXOUTBOX_TABLE", "outbox_events")
            .env_remove("TXOUTBOX_DRAIN")
            // The slot is the one named for the bench's table, which the bench drops.
            .env_remove("TXOUTBOX_SLOT")
            // Both sources keep published rows unless told otherwise, so that they do the
            // same work: the WAL source's own default deletes them on settle.
            // --relay-arg=--retention-period=0 (a flag wins over this) compares deletes.
            .env(
                "TXOUTBOX_RETENTION_PERIOD",
                std::env::var("TXOUTBOX_RETENTION_PERIOD").unwrap_or_else(|_| KEEP.into()),
            )
            .env(
                "TXOUTBOX_LOG",
                std::env::var("TXOUTBOX_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = cmd.spawn().context("starting a relay child process")?;
        let pid = child.id().context("relay child has no pid")?;
        // Keep the last lines of its stderr for the error message; a pipe nobody reads
        // would block it.
        let tail = Arc::new(Mutex::new(VecDeque::new()));
        if let Some(err) = child.stderr.take() {
            let tail = tail.clone();
            tokio::spawn(async move {
                let mut lines = BufReader::new(err).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    if let Ok(mut t) = tail.lock() {
                        if t.len() == 20 {
                            t.pop_front();
                        }
                        t.push_back(line);
                    }
                }
            });
        }
        Ok(Self {
            child,
            pid,
            peak_kib: 0,
            stderr_tail: tail,
        })
    }

    /// Peak resident set so far, KiB.
    pub fn peak_kib(&self) -> u64 {
        self.peak_kib
    }

    fn sample(&mut self) {
        if let Some(kib) = vm_hwm_kib(self.pid) {
            self.peak_kib = self.peak_kib.max(kib);
        }
    }

    /// Wait for the child to exit, sampling its RSS meanwhile; an exit other than 0 is an
    /// error carrying the end of its stderr.
    pub async fn wait(&mut self) -> anyhow::Result<()> {
        let mut tick = tokio::time::interval(RSS_POLL);
        let (pid, mut peak) = (self.pid, self.peak_kib);
        let status = loop {
            tokio::select! {
                s = self.child.wait() => break s,
                _ = tick.tick() => {
                    if let Some(kib) = vm_hwm_kib(pid) {
                        peak = peak.max(kib);
                    }
                }
            }
        };
        self.peak_kib = peak;
        self.check(status.context("waiting for a relay child")?)
    }

    /// Sample the RSS until `fut` completes (the relay keeps running).
    pub async fn sample_while<F: std::future::Future>(&mut self, fut: F) -> F::Output {
        tokio::pin!(fut);
        let mut tick = tokio::time::interval(RSS_POLL);
        loop {
            tokio::select! {
                out = &mut fut => return out,
                _ = tick.tick() => self.sample(),
            }
        }
    }

    /// Fail early if the relay died.
    pub fn check_running(&mut self) -> anyhow::Result<()> {
        match self.child.try_wait().context("polling a relay child")? {
            None => Ok(()),
            Some(status) => {
                self.check(status)?;
                anyhow::bail!("the relay exited early (status 0) while the bench needed it")
            }
        }
    }

    /// SIGTERM (graceful: settles and releases), then wait for exit 0.
    pub async fn stop(mut self) -> anyhow::Result<u64> {
        self.sample();
        let ok = std::process::Command::new("kill")
            .args(["-TERM", &self.pid.to_string()])
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        if !ok {
            self.child.start_kill().context("stopping a relay child")?;
        }
        let status = tokio::time::timeout(Duration::from_secs(30), self.child.wait())
            .await
            .context("the relay did not stop within 30 s of SIGTERM")?
            .context("waiting for a relay child")?;
        self.check(status)?;
        Ok(self.peak_kib)
    }

    /// The last lines of its stderr (at most 20).
    pub fn log_tail(&self) -> String {
        self.stderr_tail
            .lock()
            .map(|t| t.iter().cloned().collect::<Vec<_>>().join("\n"))
            .unwrap_or_default()
    }

    fn check(&self, status: ExitStatus) -> anyhow::Result<()> {
        if status.success() {
            return Ok(());
        }
        let tail = self.log_tail();
        anyhow::bail!(
            "relay child {} failed ({status}); its last log lines:\n{tail}",
            self.pid
        )
    }
}

/// The `txoutbox` binary that runs the relays: the one given, else the one beside this
/// binary (as cargo builds both into one directory), else `txoutbox` on PATH.
pub fn find_txoutbox(given: Option<&Path>) -> anyhow::Result<PathBuf> {
    if let Some(p) = given.filter(|p| !p.is_file()) {
        return Err(UsageError(format!("--txoutbox-bin {}: no such file", p.display())).into());
    }
    let beside = std::env::current_exe()
        .map(|me| me.with_file_name("txoutbox"))
        .ok()
        .filter(|p| p.is_file());
    let on_path = || {
        std::env::var_os("PATH").and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|dir| dir.join("txoutbox"))
                .find(|p| p.is_file())
        })
    };
    given
        .map(Path::to_path_buf)
        .or(beside)
        .or_else(on_path)
        .context(
            "no txoutbox binary beside this one or on PATH: build it (`cargo build -p \
             txoutbox-cli`) or pass --txoutbox-bin",
        )
}

/// VmHWM of a process from /proc (Linux); None elsewhere or once it has exited.
fn vm_hwm_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}
