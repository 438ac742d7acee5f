//! Secrets from files (`--database-url-file`, `--publisher-file`, `--admin-token-file`, and
//! their `*_FILE` environment variables: the Docker and Kubernetes secrets convention).
//!
//! A file's content replaces the plain option before anything else sees the settings, so the
//! rest of the binary has one place to look. Errors name the option and the file, never what
//! the file holds.

use std::path::Path;

use crate::cli::{Cli, Command};
use crate::ctx::UsageError;

/// Read every `*_file` option of `cli` into its plain option.
pub fn resolve(cli: &mut Cli) -> Result<(), UsageError> {
    if let Some(path) = cli.global.database_url_file.take() {
        cli.global.database_url = Some(read("--database-url-file (DATABASE_URL_FILE)", &path)?);
    }
    if let Command::Replay(replay) = &mut cli.command {
        if let Some(path) = replay.publisher_file.take() {
            replay.publisher = Some(read(
                "--publisher-file (TXOUTBOX_REPLAY_PUBLISHER_FILE)",
                &path,
            )?);
        }
    }
    if let Command::Relay(relay) = &mut cli.command {
        if let Some(path) = relay.publisher_file.take() {
            relay.publisher = Some(read("--publisher-file (TXOUTBOX_PUBLISHER_FILE)", &path)?);
        }
        if let Some(path) = relay.ops.admin_token_file.take() {
            relay.ops.admin_token = Some(read(
                "--admin-token-file (TXOUTBOX_ADMIN_TOKEN_FILE)",
                &path,
            )?);
        }
    }
    Ok(())
}

/// The file's text without its trailing newline(s); an unreadable or empty file is a usage
/// error naming `option` and the path.
pub fn read(option: &str, path: &Path) -> Result<String, UsageError> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        // io::Error's text is about the file (not found, permission denied, not UTF-8),
        // never its content.
        UsageError(format!("{option}: cannot read {}: {e}", path.display()))
    })?;
    let value = text.trim_end_matches(['\n', '\r']);
    if value.trim().is_empty() {
        return Err(UsageError(format!("{option}: {} is empty", path.display())));
    }
    Ok(value.to_string())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn reads_trims_and_names_the_file() {
        let dir = std::env::temp_dir().join(format!("txoutbox-secret-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("url");
        std::fs::write(&f, "postgres://u:pw@h/db\r\n").unwrap();
        assert_eq!(read("--x", &f).unwrap(), "postgres://u:pw@h/db");
        std::fs::write(&f, "tok en \n\n").unwrap();
        assert_eq!(read("--x", &f).unwrap(), "tok en ");
        std::fs::write(&f, "\n").unwrap();
        let e = read("--x", &f).unwrap_err().to_string();
        assert!(e.contains("--x") && e.contains("is empty"), "{e}");
        std::fs::write(&f, [0xff, 0xfe, b's', b'3', b'c']).unwrap();
        let e = read("--x", &f).unwrap_err().to_string();
        assert!(e.contains("cannot read") && !e.contains("s3c"), "{e}");
        let missing = dir.join("missing");
        let e = read("--x", &missing).unwrap_err().to_string();
        assert!(e.contains(&missing.display().to_string()), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
