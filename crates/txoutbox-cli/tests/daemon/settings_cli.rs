//! Settings as users give them, through the real binary: durations out of range (from a flag,
//! the environment or the config file), one duration grammar for flags and publisher URLs,
//! and errors that name where a bad value came from without echoing a secret.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::path::PathBuf;
use std::process::Output;

use crate::common::*;

/// A temporary directory for config files, removed on drop.
struct Dir(PathBuf);

impl Dir {
    fn new() -> Self {
        let dir = std::env::temp_dir().join(unique("txoutbox-settings"));
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }
    fn file(&self, name: &str, content: &str) -> String {
        let p = self.0.join(name);
        std::fs::write(&p, content).unwrap();
        p.to_str().unwrap().to_string()
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

async fn run(db: &TestSchema, env: &[(&str, &str)], args: &[&str]) -> Output {
    db.cli_env(env, args).await
}

/// Exit 2, one `error:` line that contains every one of `names`, and no panic.
fn assert_usage_error(out: &Output, what: &str, names: &[&str]) {
    let err = stderr(out);
    assert_eq!(out.status.code(), Some(2), "{what}: {err}");
    assert!(!err.contains("panicked"), "{what}: {err}");
    assert!(err.starts_with("error: "), "{what}: {err}");
    for n in names {
        assert!(err.contains(n), "{what}: {n:?} not named in: {err}");
    }
}

/// Every duration setting has a range: a value past it, or one that cannot be a duration, is a
/// usage error naming the setting (never a panic, never a hot loop), from every source.
#[tokio::test]
async fn out_of_range_durations_are_usage_errors_that_name_the_setting() {
    let db = TestSchema::migrated().await;
    let relay = ["relay", "--publisher", "null:", "--drain"];
    for (flag, value) in [
        ("--lease", "1e20"),
        ("--poll-interval", "1e300"),
        ("--retention-period", "99999999999999999999"),
        ("--shutdown-timeout", "2e19"),
        ("--metrics-interval", "0"),
        ("--retention-interval", "0"),
        ("--lease", "400d"),
        ("--backoff-max", "18446744073709551616s"),
        ("--partition-lease", "1M"),
    ] {
        let args: Vec<&str> = relay.iter().copied().chain([flag, value]).collect();
        let out = run(&db, &[], &args).await;
        assert_usage_error(&out, &format!("{flag} {value}"), &[flag]);
    }
    for (var, value) in [
        ("TXOUTBOX_LEASE", "1e20"),
        ("TXOUTBOX_SHUTDOWN_TIMEOUT", "2e19"),
        ("TXOUTBOX_METRICS_INTERVAL", "0"),
    ] {
        let out = run(&db, &[(var, value)], &relay).await;
        assert_usage_error(&out, &format!("{var}={value}"), &[var]);
    }
    let dir = Dir::new();
    for (line, key) in [
        ("lease = \"1e20\"", "lease"),
        ("shutdown_timeout = 2e19", "shutdown_timeout"),
        ("[relay]\nretention_interval = 0", "retention_interval"),
    ] {
        let cfg = dir.file("c.toml", &format!("{line}\n"));
        let args: Vec<&str> = ["--config", cfg.as_str()]
            .into_iter()
            .chain(relay)
            .collect();
        let out = run(&db, &[], &args).await;
        assert_usage_error(&out, line, &["c.toml", key]);
    }
    db.cleanup().await;
}

/// Publisher URL parameters read durations as flags do (`1m30s`, `2s`, `1d`): a bare number,
/// which they once read as milliseconds, is refused with a hint rather than guessed.
#[tokio::test]
async fn publisher_url_durations_take_the_flags_grammar_and_refuse_a_bare_number() {
    let db = TestSchema::migrated().await;
    let nats = nats_url();
    let stream = unique("TXO").to_uppercase();
    // A subject of its own: the default (`outbox.>`) would collide with any other stream on
    // the server that took it (a benchmark's, a user's), and JetStream refuses overlaps.
    let base = format!(
        "{nats}?stream={stream}&subject={}.{{event_type}}",
        stream.to_lowercase()
    );
    let url = format!("{base}&ack_timeout=1m30s&connect_timeout=1.5s");
    let out = run(&db, &[], &["relay", "--publisher", &url, "--drain"]).await;
    assert!(out.status.success(), "{url}: {}", stderr(&out));
    let url = format!("{base}&ack_timeout=5000");
    let out = run(&db, &[], &["relay", "--publisher", &url, "--drain"]).await;
    assert_usage_error(&out, &url, &["ack_timeout", "5000ms"]);
    let url = format!("{base}&connect_timeout=400d");
    let out = run(&db, &[], &["relay", "--publisher", &url, "--drain"]).await;
    assert_usage_error(&out, &url, &["connect_timeout"]);
    let client = async_nats::connect(nats).await.unwrap();
    let _ = async_nats::jetstream::new(client)
        .delete_stream(&stream)
        .await;
    db.cleanup().await;
}

/// A config file that is not valid TOML is reported by line and column, without the line (it
/// may hold a secret); a bad value names where it came from: the file and key, or the
/// environment variable, not a flag that was never given.
#[tokio::test]
async fn bad_values_name_their_source_and_keep_secrets_out() {
    let db = TestSchema::migrated().await;
    let dir = Dir::new();
    let relay = ["relay", "--publisher", "null:", "--drain"];
    let with = |cfg: &str| -> Vec<String> {
        ["--config", cfg]
            .into_iter()
            .chain(relay)
            .map(String::from)
            .collect()
    };
    let secret = "tok-S3cr3t-9f";
    for text in [
        format!("[relay]\nadmin_token = \"{secret}\n"),
        format!("admin_token = \"{secret}\" x\n"),
        format!("admin_token=\"{secret}\"\nbatch_size = = 3\n"),
    ] {
        let cfg = dir.file("bad.toml", &text);
        let args = with(&cfg);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = run(&db, &[], &args).await;
        let err = stderr(&out);
        assert_usage_error(&out, &text, &["bad.toml", "line"]);
        assert!(!err.contains(secret), "{text:?}: {err}");
        assert!(!err.contains("S3cr"), "{text:?}: {err}");
    }
    let cfg = dir.file("x.toml", "batch_size = \"lots\"\n");
    let args = with(&cfg);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = run(&db, &[], &args).await;
    assert_usage_error(&out, "file", &["x.toml", "batch_size", "lots"]);
    assert!(!stderr(&out).contains("--batch-size"), "{}", stderr(&out));
    let cfg = dir.file("y.toml", "[relay]\npoll_interval = \"soon\"\n");
    let args = with(&cfg);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = run(&db, &[], &args).await;
    assert_usage_error(&out, "file", &["y.toml", "poll_interval", "soon"]);
    assert!(
        !stderr(&out).contains("--poll-interval"),
        "{}",
        stderr(&out)
    );
    let out = run(&db, &[("TXOUTBOX_BATCH_SIZE", "lots")], &relay).await;
    assert_usage_error(&out, "env", &["TXOUTBOX_BATCH_SIZE", "lots"]);
    assert!(!stderr(&out).contains("'--batch-size"), "{}", stderr(&out));
    // Out of range from the environment or the file: named there too, not as the flag.
    for (var, value) in [
        ("TXOUTBOX_BATCH_SIZE", "0"),
        ("TXOUTBOX_PIPELINE", "65"),
        ("TXOUTBOX_MAX_IN_FLIGHT", "0"),
        ("TXOUTBOX_MAX_ATTEMPTS", "0"),
    ] {
        let out = run(&db, &[(var, value)], &relay).await;
        assert_usage_error(&out, var, &[var]);
    }
    let cfg = dir.file("z.toml", "[relay]\npipeline = 65\n");
    let args = with(&cfg);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = run(&db, &[], &args).await;
    assert_usage_error(&out, "file", &["z.toml", "pipeline"]);
    assert!(!stderr(&out).contains("--pipeline"), "{}", stderr(&out));
    // A flag is still named as the flag.
    let args: Vec<&str> = relay
        .iter()
        .copied()
        .chain(["--batch-size", "lots"])
        .collect();
    let out = run(&db, &[], &args).await;
    assert_usage_error(&out, "flag", &["--batch-size", "lots"]);
    db.cleanup().await;
}
