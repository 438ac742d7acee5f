//! `txoutbox config check [RELAY OPTIONS]`: what `txoutbox relay` would run with, and whether
//! it could. Every setting of the relay is printed with where its value came from (a flag, an
//! environment variable, a key of the config file, or the built-in default), secrets masked;
//! then the checks `relay` makes before it connects, the database (reachable, migrated, and for
//! the WAL source able to serve it) and each publisher URL (connected, then closed). Nothing
//! is written and no relay starts. Exit status: 0 when every check passed, 1 when one failed,
//! 2 for a setting that cannot work.
//!
//! The command line is `relay`'s: `main` parses `config check ARGS` as `relay ARGS`, so the
//! settings shown are exactly those `relay` would take, `[relay]` and `[[outbox]]` entries of
//! the config file included.

use std::ffi::OsString;
use std::process::ExitCode;
use std::time::Duration;

use clap::parser::ValueSource;

use crate::cli::{Cli, Command};
use crate::ctx::{Ctx, UsageError};

/// How long one publisher or the database may take to answer.
const CHECK_TIMEOUT: Duration = Duration::from_secs(10);

/// `args` with `config check` in place of `relay`, when they ask for it: the arguments `relay`
/// would be run with, and `true`. Otherwise `args` as they are, and `false`.
pub fn as_relay(args: Vec<OsString>) -> (Vec<OsString>, bool) {
    // Options before the subcommand that take a value (so `--schema config` is not one).
    const TAKE_VALUE: &[&str] = &[
        "--database-url",
        "--database-url-file",
        "--schema",
        "--table",
        "--config",
        "--outbox",
        "--log-format",
    ];
    let mut i = 1;
    while i < args.len() {
        let a = args[i].to_string_lossy();
        if TAKE_VALUE.contains(&a.as_ref()) {
            i += 2;
            continue;
        }
        if a.starts_with('-') {
            i += 1;
            continue;
        }
        // The first word that is not an option is the subcommand.
        if a == "config" && args.get(i + 1).is_some_and(|w| w == "check") {
            let mut out = args[..i].to_vec();
            out.push(OsString::from("relay"));
            out.extend(args[i + 2..].iter().cloned());
            return (out, true);
        }
        break;
    }
    (args, false)
}

/// One setting as `relay` would take it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Setting {
    /// The option's id, as the config file spells its key (`batch_size`).
    pub key: String,
    /// Its value, secrets masked; `-` for none.
    pub value: String,
    /// Where the value came from.
    pub from: String,
}

/// Every option of `relay` (and the global ones) in `m`, parsed by `cmd`, with its origin:
/// `file` names the config file's settings (option id, how it is named).
pub fn settings(
    cmd: &clap::Command,
    m: &clap::ArgMatches,
    file: &[(String, String)],
) -> Vec<Setting> {
    let mut out = Vec::new();
    let relay = cmd.find_subcommand("relay");
    let sub = m.subcommand_matches("relay");
    let scopes = [(Some(cmd), Some(m)), (relay, sub)];
    for (c, m) in scopes {
        let (Some(c), Some(m)) = (c, m) else { continue };
        for arg in c.get_arguments() {
            let id = arg.get_id().as_str();
            if matches!(id, "help" | "version" | "routes")
                || out.iter().any(|s: &Setting| s.key == id)
            {
                continue;
            }
            let raw: Vec<String> = m
                .get_raw(id)
                .map(|v| v.map(|s| s.to_string_lossy().into_owned()).collect())
                .unwrap_or_default();
            let value = if raw.is_empty() {
                "-".to_string()
            } else {
                masked(id, &raw.join(","))
            };
            let from = match m.value_source(id) {
                Some(ValueSource::CommandLine) => match arg.get_long() {
                    Some(long) => format!("flag --{long}"),
                    None => "command line".into(),
                },
                Some(ValueSource::EnvVariable) => match arg.get_env() {
                    Some(var) => format!("environment {}", var.to_string_lossy()),
                    None => "environment".into(),
                },
                Some(ValueSource::DefaultValue) => file
                    .iter()
                    .rev()
                    .find(|(k, _)| k == id)
                    .map_or_else(|| "default".to_string(), |(_, named)| named.clone()),
                _ => "not set".into(),
            };
            out.push(Setting {
                key: id.to_string(),
                value,
                from,
            });
        }
    }
    out
}

/// What is shown of a value: URLs without their secrets, a token not at all.
fn masked(id: &str, value: &str) -> String {
    if txoutbox::redact::is_secret_name(id) {
        return "***".into();
    }
    txoutbox::redact::redact_secrets(value)
}

/// Print `settings` as a table, one line each.
fn print_settings(name: Option<&str>, settings: &[Setting]) {
    match name {
        Some(n) => println!("outbox `{n}`"),
        None => println!("settings"),
    }
    let key_w = settings.iter().map(|s| s.key.len()).max().unwrap_or(0);
    let value_w = settings
        .iter()
        .map(|s| s.value.chars().count())
        .max()
        .unwrap_or(0)
        .min(60);
    for s in settings {
        println!(
            "  {:key_w$}  {:value_w$}  {}",
            s.key,
            s.value,
            s.from,
            key_w = key_w,
            value_w = value_w
        );
    }
}

/// One outbox to check: its name (`None`: the one of a config without `[[outbox]]`), its
/// command line parsed, and its settings with their origins.
pub struct Checked {
    pub name: Option<String>,
    pub cli: Cli,
    pub settings: Vec<Setting>,
}

/// Print every outbox's settings, then check each; the exit status says whether all passed.
pub async fn run(outboxes: Vec<Checked>) -> anyhow::Result<ExitCode> {
    let mut failed = 0usize;
    let mut usage = 0usize;
    for o in outboxes {
        print_settings(o.name.as_deref(), &o.settings);
        println!("checks");
        let name = o.name.clone();
        match check(o).await {
            Ok(report) => {
                for line in &report {
                    println!("  {line}");
                }
                failed += report.iter().filter(|l| l.failed()).count();
            }
            Err(e) => {
                let text = txoutbox::redact::redact_secrets(&format!("{e:#}"));
                println!("  FAIL  {text}");
                if e.downcast_ref::<UsageError>().is_some() {
                    usage += 1;
                } else {
                    failed += 1;
                }
            }
        }
        if name.is_some() {
            println!();
        }
    }
    Ok(if usage > 0 {
        eprintln!("error: config check: a setting cannot work (above)");
        ExitCode::from(2)
    } else if failed > 0 {
        eprintln!("error: config check: {failed} check(s) failed (above)");
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// One line of the checks.
pub struct Line {
    ok: bool,
    what: String,
}

impl Line {
    fn failed(&self) -> bool {
        !self.ok
    }
}

impl std::fmt::Display for Line {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mark = if self.ok { "ok  " } else { "FAIL" };
        write!(f, "{mark}  {}", self.what)
    }
}

/// The checks of one outbox: its settings as `relay` checks them (an error here is a setting
/// that cannot work), then its database and publishers, each on a line.
async fn check(o: Checked) -> anyhow::Result<Vec<Line>> {
    let Checked { name, mut cli, .. } = o;
    crate::secrets::resolve(&mut cli)?;
    let mut ctx = Ctx::new(&cli.global)?;
    ctx.outbox.clone_from(&name);
    let Command::Relay(args) = cli.command else {
        return Err(UsageError("config check: not a relay command line".into()).into());
    };
    let ops = args.ops.clone();
    let plan = super::relay::check(super::relay::Outbox {
        name,
        ctx: ctx.clone(),
        args,
    })?;
    crate::admin::ops::OpsConfig::from_args(&ops, plan.keep(), &[])?;
    let mut lines = vec![Line {
        ok: true,
        what: "settings: what `relay` checks before it connects".into(),
    }];
    lines.push(database(&ctx, &plan).await);
    for url in plan.publisher_urls() {
        lines.push(publisher(&url).await);
    }
    Ok(lines)
}

/// The database: reachable, migrated, and for the WAL source able to serve it.
async fn database(ctx: &Ctx, plan: &super::relay::Planned) -> Line {
    let shown = txoutbox::redact::redact_url(ctx.database_url().unwrap_or_default());
    let checked = async {
        let url = ctx.require_url()?;
        let db = ctx.db(1).await?;
        let store = db.relay_store(
            &ctx.table,
            super::retention(plan.keep()),
            url,
            plan.source(),
        )?;
        store.store.check_schema().await?;
        #[cfg(feature = "postgres")]
        if let Some(wal) = &store.wal {
            let wal = match plan.slot() {
                Some(slot) => wal.clone().with_slot(slot)?,
                None => wal.clone(),
            };
            for warning in wal.preflight().await? {
                tracing::warn!("{warning}");
            }
        }
        anyhow::Ok(format!("reachable, table {} migrated", ctx.table.display()))
    };
    line(
        &format!("database {shown}"),
        tokio::time::timeout(CHECK_TIMEOUT, checked).await,
    )
}

/// A publisher URL: connected, then closed.
async fn publisher(url: &str) -> Line {
    let checked = async {
        let p = super::open_publisher(url).await?;
        p.close()
            .await
            .map_err(|e| anyhow::anyhow!("connected, but did not close: {}", e.chain()))?;
        anyhow::Ok("connected".to_string())
    };
    line(
        &format!("publisher {}", txoutbox::redact::redact_url(url)),
        tokio::time::timeout(CHECK_TIMEOUT, checked).await,
    )
}

/// The line of the check of `what`: what it found, why it failed, or that it did not answer
/// in time; secrets redacted.
fn line(what: &str, outcome: Result<anyhow::Result<String>, tokio::time::error::Elapsed>) -> Line {
    let (ok, said) = match outcome {
        Ok(Ok(found)) => (true, found),
        Ok(Err(e)) => (false, txoutbox::redact::redact_secrets(&format!("{e:#}"))),
        Err(_) => (
            false,
            format!(
                "no answer in {}",
                txoutbox::relay::format_duration(CHECK_TIMEOUT)
            ),
        ),
    };
    Line {
        ok,
        what: format!("{what}: {said}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    fn os(args: &[&str]) -> Vec<OsString> {
        args.iter().map(OsString::from).collect()
    }

    #[test]
    fn config_check_is_parsed_as_relay() {
        let (args, check) = as_relay(os(&["txoutbox", "config", "check", "--batch-size", "5"]));
        assert!(check);
        assert_eq!(args, os(&["txoutbox", "relay", "--batch-size", "5"]));
        let (args, check) = as_relay(os(&[
            "txoutbox", "--schema", "config", "--config", "f.toml", "config", "check",
        ]));
        assert!(check);
        assert_eq!(
            args,
            os(&["txoutbox", "--schema", "config", "--config", "f.toml", "relay"])
        );
        let (args, check) = as_relay(os(&["txoutbox", "relay", "config", "check"]));
        assert!(!check);
        assert_eq!(args, os(&["txoutbox", "relay", "config", "check"]));
        let (_, check) = as_relay(os(&["txoutbox", "--schema", "config", "check"]));
        assert!(
            !check,
            "`config` is --schema's value, `check` no subcommand"
        );
    }

    #[test]
    fn each_setting_says_where_it_came_from_and_secrets_are_masked() {
        let cmd = Cli::command()
            .mut_args(|a| a.env(None))
            .mut_subcommand("relay", |s| {
                s.mut_args(|a| a.env(None))
                    .mut_arg("poll_interval", |a| a.default_value("100ms"))
            });
        let m = cmd
            .clone()
            .try_get_matches_from([
                "txoutbox",
                "--database-url",
                "postgres://app:s3cret@db:5432/app",
                "relay",
                "--batch-size",
                "7",
                "--admin-token",
                "t0ken-value",
            ])
            .unwrap();
        let file = [(
            "poll_interval".to_string(),
            "`relay.poll_interval` in config file c.toml".to_string(),
        )];
        let all = settings(&cmd, &m, &file);
        let get = |k: &str| all.iter().find(|s| s.key == k).unwrap().clone();
        assert_eq!(get("batch_size").value, "7");
        assert_eq!(get("batch_size").from, "flag --batch-size");
        assert_eq!(get("poll_interval").value, "100ms");
        assert_eq!(
            get("poll_interval").from,
            "`relay.poll_interval` in config file c.toml"
        );
        assert_eq!(get("max_attempts").from, "default");
        let url = get("database_url");
        assert!(!url.value.contains("s3cret"), "{url:?}");
        assert!(url.value.contains("app:***@db"), "{url:?}");
        assert_eq!(get("admin_token").value, "***");
        let shown = format!("{all:?}");
        assert!(
            !shown.contains("t0ken-value") && !shown.contains("s3cret"),
            "{shown}"
        );
    }
}
