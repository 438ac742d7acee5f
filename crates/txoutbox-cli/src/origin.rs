//! Where a setting's value came from, for the error about a bad one. clap names every value
//! by its flag (`invalid value 'lots' for '--batch-size <BATCH_SIZE>'`), also one that came
//! from `TXOUTBOX_BATCH_SIZE` or the config file, where the user never wrote that flag: such
//! an error is reworded to name the variable, or the file and its key.

use std::ffi::OsString;

use clap::error::{ContextKind, ContextValue, ErrorKind};

/// clap's error about a value, reworded to name its source when that is not the command
/// line: `origins` maps option ids to how the config file's settings are named. `None`:
/// clap's own error says it right (the value was a flag), or it is not about a value.
pub fn reword(
    e: &clap::Error,
    cmd: &clap::Command,
    args: &[OsString],
    origins: &[(String, String)],
) -> Option<String> {
    if !matches!(
        e.kind(),
        ErrorKind::ValueValidation | ErrorKind::InvalidValue
    ) {
        return None;
    }
    let Some(ContextValue::String(shown)) = e.get(ContextKind::InvalidArg) else {
        return None;
    };
    let long = shown.strip_prefix("--")?.split([' ', '=']).next()?;
    let arg = find(cmd, long)?;
    let flag = format!("--{long}");
    let on_command_line = args.iter().skip(1).any(|a| {
        let a = a.to_string_lossy();
        a == flag.as_str() || a.starts_with(&format!("{flag}="))
    });
    if on_command_line {
        return None;
    }
    let from_env = arg
        .get_env()
        .filter(|var| std::env::var_os(var).is_some())
        .map(|var| var.to_string_lossy().into_owned());
    let source = from_env.or_else(|| {
        origins
            .iter()
            .rev()
            .find(|(id, _)| id == arg.get_id().as_str())
            .map(|(_, label)| label.clone())
    })?;
    let text = e.to_string();
    let first = text.lines().next().unwrap_or_default();
    Some(first.replacen(&format!("'{shown}'"), &source, 1))
}

/// The option whose long name is `long`, in `cmd` or any of its subcommands.
fn find<'a>(cmd: &'a clap::Command, long: &str) -> Option<&'a clap::Arg> {
    cmd.get_arguments()
        .find(|a| a.get_long() == Some(long))
        .or_else(|| cmd.get_subcommands().find_map(|s| find(s, long)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    fn error(cmd: &clap::Command, args: &[&str]) -> clap::Error {
        cmd.clone().try_get_matches_from(args).unwrap_err()
    }

    fn os(args: &[&str]) -> Vec<OsString> {
        args.iter().map(OsString::from).collect()
    }

    #[test]
    fn a_file_value_is_named_by_its_key_and_a_flag_stays_a_flag() {
        let cmd = crate::cli::Cli::command()
            .mut_subcommand("relay", |s| {
                s.mut_args(|a| a.env(None))
                    .mut_arg("batch_size", |a| a.default_value("lots"))
            })
            .mut_args(|a| a.env(None));
        let origins = [(
            "batch_size".to_string(),
            "`batch_size` in config file x.toml".to_string(),
        )];
        let args = ["txoutbox", "relay"];
        let e = error(&cmd, &args);
        let text = reword(&e, &cmd, &os(&args), &origins).unwrap();
        assert!(
            text.starts_with("error: invalid value 'lots' for `batch_size` in config file x.toml"),
            "{text}"
        );
        assert!(!text.contains("--batch-size"), "{text}");
        let args = ["txoutbox", "relay", "--batch-size=many"];
        let e = error(&cmd, &args);
        assert_eq!(reword(&e, &cmd, &os(&args), &origins), None);
        // Not about a value: clap's error as it is.
        let args = ["txoutbox", "relay", "--no-such-flag"];
        let e = error(&cmd, &args);
        assert_eq!(reword(&e, &cmd, &os(&args), &origins), None);
    }
}
