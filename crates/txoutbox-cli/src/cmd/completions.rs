//! `txoutbox completions SHELL`: the shell's completion script, on stdout.

use std::io::Write;
use std::process::ExitCode;

use anyhow::Context;
use clap::CommandFactory;
use clap_complete::Shell;

#[derive(Debug, clap::Args)]
pub struct CompletionsArgs {
    /// The shell to complete in
    #[arg(value_enum)]
    pub shell: Shell,
}

pub fn run(a: &CompletionsArgs) -> anyhow::Result<ExitCode> {
    let mut cmd = crate::cli::Cli::command();
    let name = cmd.get_name().to_string();
    // Rendered in memory first: clap_complete panics on a failed write, stdout may be closed.
    let mut script = Vec::new();
    clap_complete::generate(a.shell, &mut cmd, name, &mut script);
    std::io::stdout()
        .lock()
        .write_all(&script)
        .context("cannot write the completion script to stdout")?;
    Ok(ExitCode::SUCCESS)
}
