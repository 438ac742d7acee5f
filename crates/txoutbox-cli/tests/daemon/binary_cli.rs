//! The binary as users and packagers meet it: `--version` with the commit it was built from,
//! shell completion scripts, man pages, `--help` grouped under headings, and the process and
//! build series a running relay exposes on /metrics, as promtool reads them.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::path::Path;
use std::process::{Output, Stdio};

use crate::common::*;

/// `txoutbox ARGS`, without settings from the environment.
fn txoutbox(args: &[&str]) -> Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_txoutbox"))
        .args(args)
        .env_remove("TXOUTBOX_CONFIG")
        .env_remove("DATABASE_URL")
        .stdin(Stdio::null())
        .output()
        .expect("run txoutbox")
}

fn ok_stdout(args: &[&str]) -> String {
    let out = txoutbox(args);
    assert!(out.status.success(), "txoutbox {args:?}: {}", stderr(&out));
    stdout(&out)
}

/// A tool the checks below run, found on PATH; `None` (and a note) outside CI when it is
/// missing, a failure in CI (scripts/tools.sh installs it).
fn tool(name: &str, package: &str) -> Option<()> {
    let found = std::process::Command::new("sh")
        .args(["-c", &format!("command -v {name}")])
        .output()
        .is_ok_and(|o| o.status.success());
    if !found {
        assert!(
            std::env::var_os("CI").is_none(),
            "{name} is required in CI (scripts/tools.sh installs {package})"
        );
        eprintln!("SKIPPED the {name} check: {name} is not installed (scripts/tools.sh)");
    }
    found.then_some(())
}

/// The commit in `txoutbox --version`: `txoutbox 0.1.0 (commit 0123456789[-dirty])`.
fn version_commit() -> String {
    let text = ok_stdout(&["--version"]);
    let prefix = format!("txoutbox {} (commit ", env!("CARGO_PKG_VERSION"));
    let commit = text
        .trim()
        .strip_prefix(&prefix)
        .and_then(|r| r.strip_suffix(')'))
        .unwrap_or_else(|| panic!("--version printed {text:?}, not `{prefix}...)`"));
    commit.to_string()
}

#[test]
fn version_names_the_commit_the_binary_was_built_from() {
    let commit = version_commit();
    // Every subcommand says the same.
    assert!(ok_stdout(&["relay", "--version"]).contains(&format!("(commit {commit})")));
    let head = std::process::Command::new("git")
        .args(["rev-parse", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output();
    match head {
        // Built in this checkout (as in CI): the short hash of HEAD, `-dirty` or not.
        Ok(h) if h.status.success() && std::env::var_os("TXOUTBOX_BUILD_COMMIT").is_none() => {
            let head = String::from_utf8_lossy(&h.stdout).trim().to_string();
            let hash = commit.strip_suffix("-dirty").unwrap_or(&commit);
            assert_eq!(hash.len(), 10, "commit {commit:?}");
            assert!(hash.chars().all(|c| c.is_ascii_hexdigit()), "{commit:?}");
            assert!(
                head.starts_with(hash),
                "--version names {commit}, HEAD is {head}"
            );
        }
        _ => assert!(!commit.is_empty()),
    }
}

const SUBCOMMANDS: [&str; 10] = [
    "migrate",
    "enqueue",
    "relay",
    "status",
    "slot",
    "dlq",
    "events",
    "demo",
    "completions",
    "man",
];

#[test]
fn completion_scripts_are_valid_and_name_every_command() {
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let script = ok_stdout(&["completions", shell]);
        // Options without their dashes: fish names them `-l batch-size`.
        for name in SUBCOMMANDS.iter().chain(&["batch-size", "database-url"]) {
            assert!(script.contains(name), "{shell}: no {name} in the script");
        }
    }
    let path = std::env::temp_dir().join(format!("{}.bash", unique("txoutbox-completion")));
    std::fs::write(&path, ok_stdout(&["completions", "bash"])).unwrap();
    let check = |script: &str| {
        let out = std::process::Command::new("bash")
            .args(["-c", script, "check", path.to_str().unwrap()])
            .output()
            .unwrap();
        std::fs::remove_file(&path).ok();
        (out.status.success(), stdout(&out), stderr(&out))
    };
    // Valid syntax, and sourcing it registers a completion for `txoutbox`.
    let (ok, out, err) = check(r#"bash -n "$1" && source "$1" && complete -p txoutbox"#);
    assert!(ok && err.is_empty(), "bash: {err}");
    assert!(out.contains("txoutbox"), "complete -p: {out}");
}

/// `groff` on a page as `man` would show it, as plain text; `None` without groff.
fn render(page: &Path) -> Option<String> {
    tool("groff", "groff-base")?;
    let out = std::process::Command::new("groff")
        .args(["-man", "-Tascii", "-P-cbou", "-ww"])
        .arg(page)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "groff {}: {}",
        page.display(),
        stderr(&out)
    );
    assert!(
        stderr(&out).is_empty(),
        "groff warns on {}: {}",
        page.display(),
        stderr(&out)
    );
    Some(stdout(&out))
}

#[test]
fn man_pages_are_valid_roff_for_every_command() {
    let page = ok_stdout(&["man"]);
    for want in [
        ".TH txoutbox 1",
        ".SH NAME",
        ".SH SYNOPSIS",
        ".SH OPTIONS",
        ".SH SUBCOMMANDS",
    ] {
        assert!(
            page.lines().any(|l| l.starts_with(want)),
            "no `{want}` line in `txoutbox man`:\n{page}"
        );
    }
    assert!(page.contains("txoutbox\\-relay(1)"), "{page}");
    let dir = std::env::temp_dir().join(unique("txoutbox-man"));
    let listed = ok_stdout(&["man", "--dir", dir.to_str().unwrap()]);
    let files: Vec<&str> = listed.lines().collect();
    for sub in SUBCOMMANDS {
        let path = dir.join(format!("txoutbox-{sub}.1"));
        assert!(files.contains(&path.to_str().unwrap()), "{listed}");
    }
    for path in ["txoutbox.1", "txoutbox-dlq-list.1", "txoutbox-slot-drop.1"] {
        assert!(dir.join(path).is_file(), "no {path} in {listed}");
    }
    assert!(!dir.join("txoutbox-help.1").exists(), "a page for `help`");
    assert_eq!(
        std::fs::read_to_string(dir.join("txoutbox.1")).unwrap(),
        page
    );
    let relay = dir.join("txoutbox-relay.1");
    let roff = std::fs::read_to_string(&relay).unwrap();
    assert!(
        roff.contains("TXOUTBOX_BATCH_SIZE"),
        "the relay page has no env"
    );
    if let Some(text) = render(&relay) {
        for want in ["NAME", "SYNOPSIS", "OPTIONS", "--batch-size", "--publisher"] {
            assert!(text.contains(want), "no {want} in the relay page:\n{text}");
        }
        let top = render(&dir.join("txoutbox.1")).unwrap();
        assert!(top.contains("txoutbox-relay(1)"), "{top}");
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn relay_help_groups_its_options_under_headings() {
    let help = ok_stdout(&["relay", "--help"]);
    let lines: Vec<&str> = help.lines().collect();
    for (flag, heading) in [
        ("--database-url", "Database:"),
        ("--schema", "Database:"),
        ("--publisher", "Publisher:"),
        ("--source", "Source:"),
        ("--batch-size", "Tuning:"),
        ("--poll-interval", "Tuning:"),
        ("--max-attempts", "Retries and ordering:"),
        ("--mode", "Retries and ordering:"),
        ("--retention-period", "Retention:"),
        ("--retention-interval", "Retention:"),
        ("--admin-addr", "Admin:"),
        ("--metrics-interval", "Admin:"),
        ("--inject-faults", "Testing:"),
        ("--config", "Options:"),
        ("--drain", "Options:"),
    ] {
        let at = lines
            .iter()
            .position(|l| {
                let l = l.trim_start();
                l == flag || l.starts_with(&format!("{flag} "))
            })
            .unwrap_or_else(|| panic!("no {flag} in relay --help:\n{help}"));
        let under = lines[..at]
            .iter()
            .rev()
            .find(|l| !l.starts_with(' ') && l.ends_with(':'))
            .unwrap_or_else(|| panic!("{flag} is under no heading:\n{help}"));
        assert_eq!(*under, heading, "{flag}:\n{help}");
    }
}

/// The value of the series `name` (without labels) in an exposition.
fn value(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .filter_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .find_map(|v| v.trim().parse().ok())
}

/// A running relay's /metrics carries the process's series and the build's, and promtool
/// accepts the whole exposition.
#[tokio::test]
async fn a_relay_exposes_process_and_build_series_promtool_accepts() {
    let db = TestSchema::migrated().await;
    let port = free_port();
    let before = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let relay = db
        .command(&[
            "relay",
            "--publisher",
            "null:",
            "--admin-addr",
            &format!("127.0.0.1:{port}"),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_until(60, "the admin listener", || async move {
        tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
    })
    .await;
    let (status, text) = http(port, "GET", "/metrics", None, "").await;
    assert_eq!(status, 200, "{text}");
    let rss = value(&text, "process_resident_memory_bytes").unwrap_or(0.0);
    assert!(rss > 0.0, "resident memory {rss}:\n{text}");
    for name in [
        "process_cpu_seconds_total",
        "process_virtual_memory_bytes",
        "process_open_fds",
        "process_max_fds",
    ] {
        assert!(value(&text, name).is_some(), "no {name}:\n{text}");
    }
    // The process's own start, not the scrape's time: the relay started after `before`
    // (the boot time it is counted from is in whole seconds: two seconds' slack).
    let started = value(&text, "process_start_time_seconds").unwrap();
    assert!(
        started >= before - 2.0 && started <= before + 60.0,
        "start time {started}, test started {before}"
    );
    let build = format!(
        "txoutbox_build_info{{version=\"{}\",commit=\"{}\"}} 1",
        env!("CARGO_PKG_VERSION"),
        version_commit()
    );
    assert!(text.lines().any(|l| l == build), "no `{build}` in:\n{text}");
    if tool("promtool", "prometheus").is_some() {
        let mut check = tokio::process::Command::new("promtool")
            .args(["check", "metrics"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        use tokio::io::AsyncWriteExt;
        let mut stdin = check.stdin.take().unwrap();
        stdin.write_all(text.as_bytes()).await.unwrap();
        drop(stdin);
        let out = check.wait_with_output().await.unwrap();
        assert!(
            out.status.success(),
            "promtool check metrics: {}{}\n{text}",
            stdout(&out),
            stderr(&out)
        );
    }
    stop(relay).await;
    db.cleanup().await;
}
