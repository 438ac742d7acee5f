//! `txoutbox`: the relay daemon and the operator's CLI.

mod admin;
mod cli;
mod cmd;
mod config;
mod ctx;
mod secrets;
#[cfg(feature = "otel")]
mod telemetry;

use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches};

use crate::cli::{Cli, Command, LogFormat};
use crate::ctx::{Ctx, UsageError};

fn main() -> ExitCode {
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let mut command = Cli::command();
    let mut routes = Vec::new();
    if let Some(path) = config::config_path(&args) {
        match config::apply_file(command, &path) {
            Ok(file) => {
                command = file.command;
                routes = file.routes;
            }
            Err(e) => {
                eprintln!(
                    "error: {}",
                    txoutbox::publish::redact_secrets(&format!("{e:#}"))
                );
                return ExitCode::from(2);
            }
        }
    }
    let mut cli = match command
        .try_get_matches_from(&args)
        .and_then(|m| Cli::from_arg_matches(&m))
    {
        Ok(cli) => cli,
        Err(e) => e.exit(), // usage errors exit 2, --help/--version 0
    };
    if let Command::Relay(relay) = &mut cli.command {
        relay.routes = routes;
    }
    init_logging(cli.global.log_format);
    // Before the runtime: the OTLP exporter's blocking HTTP client must not be made (or
    // dropped) on it. Dropped after the runtime, flushing what is queued.
    #[cfg(feature = "otel")]
    let _telemetry = match telemetry::init() {
        Ok(t) => t,
        Err(e) => {
            eprintln!(
                "error: {}",
                txoutbox::publish::redact_secrets(&format!("{e:#}"))
            );
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(code) => code,
        Err(e) => {
            // The last line of defence: whatever an error quotes (a URL, a client library's
            // echo of its settings), no secret reaches the terminal.
            eprintln!(
                "error: {}",
                txoutbox::publish::redact_secrets(&format!("{e:#}"))
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
    match cli.command {
        Command::Migrate => cmd::migrate::run(&ctx).await,
        Command::Enqueue(a) => cmd::enqueue::run(&ctx, a).await,
        Command::Relay(a) => cmd::relay::run(&ctx, a).await,
        Command::Status(a) => cmd::status::run(&ctx, a).await,
        Command::Slot(a) => cmd::slot::run(&ctx, a).await,
        Command::Dlq(a) => cmd::dlq::run(&ctx, a).await,
        Command::Events(a) => cmd::events::run(&ctx, a).await,
        Command::Demo(a) => cmd::demo::run(&ctx, a).await,
    }
}

fn init_logging(format: LogFormat) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_env("TXOUTBOX_LOG")
        .or_else(|_| EnvFilter::try_from_default_env())
        .unwrap_or_else(|_| EnvFilter::new("info,sqlx=warn,lapin::returned_messages=error"));
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
