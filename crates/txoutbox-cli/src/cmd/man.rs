//! `txoutbox man`: the manual page, in roff. On stdout, txoutbox(1): what the daemon is, the
//! options every command takes and the list of commands. With `--dir DIR`, one page a
//! command, as git and cargo ship theirs (txoutbox.1, txoutbox-relay.1, txoutbox-dlq-list.1,
//! ...): the relay alone has some thirty options, and `man txoutbox-relay` opens them.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::CommandFactory;

#[derive(Debug, clap::Args)]
pub struct ManArgs {
    /// Write a page for every command into this directory (created if missing) instead, and
    /// print their paths: txoutbox.1 and txoutbox-SUBCOMMAND.1, for e.g. /usr/share/man/man1
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
}

pub fn run(a: &ManArgs) -> anyhow::Result<ExitCode> {
    // No `help` subcommand on the pages: `man` is the help.
    let mut cmd = crate::cli::Cli::command().disable_help_subcommand(true);
    cmd.build();
    let mut out = std::io::stdout().lock();
    match &a.dir {
        None => {
            let mut page = Vec::new();
            page_of(cmd)
                .render(&mut page)
                .context("cannot render the man page")?;
            out.write_all(&page)
                .context("cannot write the man page to stdout")?;
        }
        Some(dir) => {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
            for path in write_pages(cmd, dir)? {
                writeln!(out, "{}", path.display()).context("cannot write to stdout")?;
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn page_of(cmd: clap::Command) -> clap_mangen::Man {
    clap_mangen::Man::new(cmd).manual("txoutbox manual")
}

/// The page of `cmd` and of each of its visible subcommands, depth first; the paths written.
fn write_pages(cmd: clap::Command, dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut written = Vec::new();
    let subs: Vec<clap::Command> = cmd
        .get_subcommands()
        .filter(|s| !s.is_hide_set())
        .cloned()
        .collect();
    let man = page_of(cmd);
    let path = dir.join(man.get_filename());
    let mut page = Vec::new();
    man.render(&mut page)
        .context("cannot render the man page")?;
    std::fs::write(&path, page).with_context(|| format!("cannot write {}", path.display()))?;
    written.push(path);
    for sub in subs {
        written.extend(write_pages(sub, dir)?);
    }
    Ok(written)
}
