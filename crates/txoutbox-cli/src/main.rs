//! `txoutbox`: the relay daemon and the operator's CLI.

mod admin;
mod cli;
mod cmd;
mod config;
mod ctx;
mod notify;
mod origin;
mod preview;
mod secrets;
#[cfg(feature = "otel")]
mod telemetry;
mod values;
mod version;

use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches};

use crate::cli::{Cli, Command, LogFormat};
use crate::ctx::{Ctx, UsageError};

/// The async runtime's worker threads: `TOKIO_WORKER_THREADS` when set, else one per outbox the
/// process relays (`outboxes`, 0 without `[[outbox]]` entries), at most one per core. A relay is
/// I/O-bound, and each thread more costs memory (its allocator arena).
fn worker_threads(outboxes: usize) -> Result<usize, String> {
    match std::env::var("TOKIO_WORKER_THREADS") {
        Ok(v) => match v.trim().parse::<usize>() {
            Ok(n) if n >= 1 => Ok(n),
            _ => Err(format!(
                "TOKIO_WORKER_THREADS is {v:?}: it must be a whole number of threads, 1 or more"
            )),
        },
        Err(std::env::VarError::NotUnicode(_)) => {
            Err("TOKIO_WORKER_THREADS is not valid UTF-8: it must be a whole number of threads, 1 or more".into())
        }
        Err(std::env::VarError::NotPresent) => {
            let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
            Ok(outboxes.clamp(1, cores))
        }
    }
}

fn main() -> ExitCode {
    // `config check ARGS` is parsed as `relay ARGS`: the settings it shows are relay's.
    let (args, check) = cmd::config::as_relay(std::env::args_os().collect());
    let mut command = Cli::command();
    let mut routes = Vec::new();
    let mut outbox_specs = Vec::new();
    let mut origins = Vec::new();
    if let Some(path) = config::config_path(&args) {
        match config::apply_file(command, &path) {
            Ok(file) => {
                command = file.command;
                routes = file.routes;
                outbox_specs = file.outboxes;
                origins = file.origins;
            }
            Err(e) => {
                eprintln!(
                    "error: {}",
                    txoutbox::redact::redact_secrets(&format!("{e:#}"))
                );
                return ExitCode::from(2);
            }
        }
    }
    let (mut cli, matches) = match command
        .clone()
        .try_get_matches_from(&args)
        .and_then(|m| Cli::from_arg_matches(&m).map(|cli| (cli, m)))
    {
        Ok(parsed) => parsed,
        // A value from the environment or the file is named as such, not as its flag.
        Err(e) => match origin::reword(&e, &command, &args, &origins) {
            Some(text) => {
                eprintln!("{}", txoutbox::redact::redact_secrets(&text));
                return ExitCode::from(2);
            }
            None => e.exit(), // usage errors exit 2, --help/--version 0
        },
    };
    // Text about the command line itself: no database, no runtime, no [[outbox]] to go through.
    if let Some(outcome) = offline(&cli.command) {
        return exit_code(outcome);
    }
    if let Command::Relay(relay) = &mut cli.command {
        relay.routes = routes;
    }
    // With [[outbox]] entries: the command once per outbox it acts on.
    let outboxes = match outbox_clis(&command, &args, &cli, &outbox_specs, &origins) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("error: {}", txoutbox::redact::redact_secrets(&e));
            return ExitCode::from(2);
        }
    };
    init_logging(cli.global.log_format);
    // Before the runtime: the OTLP exporter's blocking HTTP client must not be made (or
    // dropped) on it. Dropped after the runtime, flushing what is queued.
    #[cfg(feature = "otel")]
    let _telemetry = match telemetry::init() {
        Ok(t) => t,
        Err(e) => {
            eprintln!(
                "error: {}",
                txoutbox::redact::redact_secrets(&format!("{e:#}"))
            );
            return ExitCode::from(2);
        }
    };
    let workers = match worker_threads(outboxes.len()) {
        Ok(n) => n,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let outcome = if check {
        let checked = if outboxes.is_empty() {
            let settings = cmd::config::settings(&command, &matches, &origins);
            vec![cmd::config::Checked {
                name: None,
                cli,
                settings,
            }]
        } else {
            outboxes
                .into_iter()
                .map(|(name, cli, settings)| cmd::config::Checked {
                    name: Some(name),
                    cli,
                    settings,
                })
                .collect()
        };
        runtime.block_on(cmd::config::run(checked))
    } else if outboxes.is_empty() {
        runtime.block_on(run(cli))
    } else {
        let outboxes = outboxes.into_iter().map(|(n, c, _)| (n, c)).collect();
        runtime.block_on(run_outboxes(cli, outboxes))
    };
    exit_code(outcome)
}

/// The process's exit code for a command's outcome, its error printed.
fn exit_code(outcome: anyhow::Result<ExitCode>) -> ExitCode {
    match outcome {
        Ok(code) => code,
        Err(e) => {
            // The last line of defence: whatever an error quotes (a URL, a client library's
            // echo of its settings), no secret reaches the terminal.
            eprintln!(
                "error: {}",
                txoutbox::redact::redact_secrets(&format!("{e:#}"))
            );
            if e.downcast_ref::<UsageError>().is_some() {
                ExitCode::from(2)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}

async fn run(mut cli: Cli) -> anyhow::Result<ExitCode> {
    secrets::resolve(&mut cli)?;
    let ctx = Ctx::new(&cli.global)?;
    dispatch(&ctx, cli.command).await
}

async fn dispatch(ctx: &Ctx, command: Command) -> anyhow::Result<ExitCode> {
    match command {
        Command::Migrate(a) => cmd::migrate::run(ctx, a).await,
        Command::Enqueue(a) => cmd::enqueue::run(ctx, a).await,
        Command::Relay(args) => {
            let one = cmd::relay::Outbox {
                name: ctx.outbox.clone(),
                ctx: ctx.clone(),
                args,
            };
            cmd::relay::run(vec![one]).await
        }
        Command::Status(a) => cmd::status::run(ctx, a).await,
        Command::Slot(a) => cmd::slot::run(ctx, a).await,
        Command::Dlq(a) => cmd::dlq::run(ctx, a).await,
        Command::Events(a) => cmd::events::run(ctx, a).await,
        Command::Replay(a) => cmd::replay::run(ctx, a).await,
        Command::Demo(a) => cmd::demo::run(ctx, a).await,
        // `main` runs `config check` as `relay`'s command line; here only when it came
        // after options it does not take.
        Command::Config(_) => Err(UsageError(
            "config check goes right after the global options (--config, --database-url, \
             --schema, --table, --outbox), and relay's options after it: txoutbox --config \
             FILE config check [RELAY OPTIONS]"
                .into(),
        )
        .into()),
        Command::Completions(a) => cmd::completions::run(&a),
        Command::Man(a) => cmd::man::run(&a),
    }
}

/// The commands that print what the command line describes (`completions`, `man`): run
/// without a database or a runtime. `None` for every other command.
fn offline(command: &Command) -> Option<anyhow::Result<ExitCode>> {
    match command {
        Command::Completions(a) => Some(cmd::completions::run(a)),
        Command::Man(a) => Some(cmd::man::run(a)),
        _ => None,
    }
}

/// The command parsed once for each `[[outbox]]` it acts on (all of them, or `--outbox
/// NAME`'s), with that entry's settings in place, and where each setting came from: empty
/// when the file has no `[[outbox]]`.
fn outbox_clis(
    command: &clap::Command,
    args: &[std::ffi::OsString],
    cli: &Cli,
    specs: &[config::OutboxSpec],
    file_origins: &[(String, String)],
) -> Result<Vec<(String, Cli, Vec<cmd::config::Setting>)>, String> {
    let names = || {
        specs
            .iter()
            .map(|s| s.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let picked: Vec<&config::OutboxSpec> = match (&cli.global.outbox, specs.is_empty()) {
        (None, _) => specs.iter().collect(),
        (Some(_), true) => {
            return Err(
                "--outbox NAME (TXOUTBOX_OUTBOX) picks one of the config file's [[outbox]] \
                 entries, and there are none"
                    .into(),
            )
        }
        (Some(name), false) => match specs.iter().find(|s| &s.name == name) {
            Some(s) => vec![s],
            None => {
                return Err(format!(
                    "--outbox {name}: the config file has no [[outbox]] of that name (it has: {})",
                    names()
                ))
            }
        },
    };
    let mut out = Vec::with_capacity(picked.len());
    for spec in picked {
        let cmd = config::outbox_command(command.clone(), spec);
        // The entry's own settings are named as its, over the file's top level.
        let mut origins = file_origins.to_vec();
        origins.extend(spec.settings.iter().map(|(id, _)| {
            (
                id.clone(),
                format!("`{id}` of [[outbox]] `{}` in the config file", spec.name),
            )
        }));
        let m = cmd.clone().try_get_matches_from(args).map_err(|e| {
            let text = origin::reword(&e, &cmd, args, &origins)
                .map(|t| t.trim_start_matches("error: ").to_string())
                .unwrap_or_else(|| clap_text(&e));
            format!("outbox `{}`: {text}", spec.name)
        })?;
        let both = config::outbox_conflicts(&cmd, &m, spec);
        if !both.is_empty() {
            let keys: Vec<String> = both.iter().map(|(k, _)| format!("`{k}`")).collect();
            let flags: Vec<String> = both
                .iter()
                .map(|(_, f)| format!("--{}", f.replace('_', "-")))
                .collect();
            return Err(format!(
                "outbox `{}` sets {} in the config file, and the command line gives {} too: an \
                 outbox's own settings are not overridden; drop the flag, or pick another outbox \
                 with --outbox NAME",
                spec.name,
                keys.join(", "),
                flags.join(", ")
            ));
        }
        let mut c = Cli::from_arg_matches(&m)
            .map_err(|e| format!("outbox `{}`: {}", spec.name, clap_text(&e)))?;
        if let Command::Relay(relay) = &mut c.command {
            relay.routes = spec.routes.clone();
        }
        let settings = cmd::config::settings(&cmd, &m, &origins);
        out.push((spec.name.clone(), c, settings));
    }
    Ok(out)
}

/// A clap error's message, on one line and without its `error: ` prefix.
fn clap_text(e: &clap::Error) -> String {
    let text = e.to_string();
    let first = text.lines().next().unwrap_or_default();
    first.trim_start_matches("error: ").trim().to_string()
}

/// A command over the config file's outboxes: `relay` runs them all in this process,
/// `status` and `migrate` go through them in turn (one that fails does not stop the
/// others), the rest need exactly one.
async fn run_outboxes(cli: Cli, mut outboxes: Vec<(String, Cli)>) -> anyhow::Result<ExitCode> {
    use anyhow::Context;
    let names: Vec<String> = outboxes.iter().map(|(n, _)| n.clone()).collect();
    match &cli.command {
        Command::Relay(_) => {
            let mut runs = Vec::with_capacity(outboxes.len());
            for (name, mut c) in outboxes {
                secrets::resolve(&mut c)
                    .map_err(|e| UsageError(format!("outbox `{name}`: {}", e.0)))?;
                let mut ctx = Ctx::new(&c.global).with_context(|| format!("outbox `{name}`"))?;
                ctx.outbox = Some(name.clone());
                if let Command::Relay(args) = c.command {
                    runs.push(cmd::relay::Outbox {
                        name: Some(name),
                        ctx,
                        args,
                    });
                }
            }
            cmd::relay::run(runs).await
        }
        Command::Status(_) | Command::Migrate(_) => {
            let mut failed = 0;
            for (name, c) in outboxes {
                if let Err(e) = run_named(c, &name).await {
                    eprintln!(
                        "error: outbox `{name}`: {}",
                        txoutbox::redact::redact_secrets(&format!("{e:#}"))
                    );
                    failed += 1;
                }
            }
            Ok(if failed == 0 {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
        _ if outboxes.len() == 1 => {
            let (name, c) = outboxes.remove(0);
            run_named(c, &name).await
        }
        _ => Err(UsageError(format!(
            "this command acts on one outbox, and the config file has {} ({}): name one with \
             --outbox NAME",
            names.len(),
            names.join(", ")
        ))
        .into()),
    }
}

/// [`run`] for the outbox `name`.
async fn run_named(mut cli: Cli, name: &str) -> anyhow::Result<ExitCode> {
    secrets::resolve(&mut cli)?;
    let mut ctx = Ctx::new(&cli.global)?;
    ctx.outbox = Some(name.to_string());
    dispatch(&ctx, cli.command).await
}

fn init_logging(format: LogFormat) {
    use tracing_subscriber::EnvFilter;
    let given = ["TXOUTBOX_LOG", "RUST_LOG"]
        .iter()
        .find_map(|v| std::env::var(v).ok())
        .unwrap_or_default();
    let mut filter = EnvFilter::try_from_env("TXOUTBOX_LOG")
        .or_else(|_| EnvFilter::try_from_default_env())
        .unwrap_or_else(|_| EnvFilter::new("info,sqlx=warn,lapin::returned_messages=error"));
    // The AWS credential chain warns of each source it tried with a debug dump of its answer;
    // a call without credentials is reported once, saying what to set (publish::aws). Unless
    // the filter given says otherwise about it.
    if !given.contains("aws_config") {
        if let Ok(quiet) = "aws_config::meta::credentials=error".parse() {
            filter = filter.add_directive(quiet);
        }
    }
    // Colour only on a terminal (and not with NO_COLOR set): escape codes in a file, a pipe
    // or a log collector are noise.
    let colour = std::io::IsTerminal::is_terminal(&std::io::stderr())
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(colour)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Pretty => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}
