//! The commit the daemon is built from, for `txoutbox --version` and the
//! `txoutbox_build_info` metric: `TXOUTBOX_COMMIT`, a short hash with `-dirty` when tracked
//! files had changes, or `unknown`.
//!
//! Read, in order, from: the environment variable `TXOUTBOX_BUILD_COMMIT` (for a build whose
//! `.git` is not at hand, e.g. a container build that copies only the sources); the
//! `.cargo_vcs_info.json` that `cargo package` writes into a packaged crate (so a crate built
//! from its package names the commit it was packaged from, even when unpacked inside another
//! checkout); `git` itself. No git, no repository: `unknown`, never a failed build.
//!
//! Only `std` and the `git` command: nothing to compile for it.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Hex digits of the short hash: unambiguous in this repository for years, and the same
/// length whichever way the hash was found.
const SHORT: usize = 10;

fn main() {
    println!("cargo::rerun-if-env-changed=TXOUTBOX_BUILD_COMMIT");
    let dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
    let commit = from_env()
        .or_else(|| from_package(&dir))
        .or_else(|| from_git(&dir))
        .unwrap_or_else(|| "unknown".to_string());
    println!("cargo::rustc-env=TXOUTBOX_COMMIT={commit}");
}

fn from_env() -> Option<String> {
    let v = std::env::var("TXOUTBOX_BUILD_COMMIT").ok()?;
    let v = v.trim();
    let ok =
        !v.is_empty() && v.len() <= 64 && v.chars().all(|c| c.is_ascii_alphanumeric() || c == '-');
    ok.then(|| v.to_string())
}

/// `{"git": {"sha1": "<40 hex>", "dirty": true}, ...}`, as `cargo package` writes it (`dirty`
/// only when packaged with `--allow-dirty` from a changed tree).
fn from_package(dir: &Path) -> Option<String> {
    let path = dir.join(".cargo_vcs_info.json");
    let text = std::fs::read_to_string(&path).ok()?;
    println!("cargo::rerun-if-changed={}", path.display());
    let at = text.find("\"sha1\"")?;
    let rest = &text[at + "\"sha1\"".len()..];
    let start = rest.find('"')? + 1;
    let hash: String = rest[start..]
        .chars()
        .take_while(char::is_ascii_hexdigit)
        .collect();
    if hash.len() < SHORT {
        return None;
    }
    let compact: String = text.split_whitespace().collect();
    let dirty = compact.contains("\"dirty\":true");
    Some(with_dirty(&hash[..SHORT], dirty))
}

fn from_git(dir: &Path) -> Option<String> {
    let hash = git(dir, &["rev-parse", &format!("--short={SHORT}"), "HEAD"])?;
    // Build again when HEAD moves (a checkout, a commit), the index changes (add, commit,
    // reset) or a source of the workspace does (it may make the tree dirty).
    let git_dir = absolute(dir, &git(dir, &["rev-parse", "--git-dir"])?);
    let common = absolute(dir, &git(dir, &["rev-parse", "--git-common-dir"])?);
    let mut watch = vec![git_dir.join("HEAD"), git_dir.join("index")];
    if let Some(head_ref) = git(dir, &["symbolic-ref", "-q", "HEAD"]) {
        watch.push(common.join(head_ref));
    }
    watch.push(common.join("packed-refs"));
    if let Some(top) = git(dir, &["rev-parse", "--show-toplevel"]) {
        let top = PathBuf::from(top);
        watch.extend(["crates", "Cargo.toml", "Cargo.lock"].map(|p| top.join(p)));
    }
    for path in watch.iter().filter(|p| p.exists()) {
        println!("cargo::rerun-if-changed={}", path.display());
    }
    // Tracked files only (as `git describe --dirty`); no optional lock, so the build never
    // writes into the repository nor waits for a git command running beside it.
    let status = Command::new("git")
        .args(["status", "--porcelain", "--untracked-files=no"])
        .current_dir(dir)
        .env("GIT_OPTIONAL_LOCKS", "0")
        .output()
        .ok()?;
    if !status.status.success() {
        return None;
    }
    Some(with_dirty(&hash, !status.stdout.is_empty()))
}

fn with_dirty(hash: &str, dirty: bool) -> String {
    if dirty {
        format!("{hash}-dirty")
    } else {
        hash.to_string()
    }
}

/// One line of `git ARGS` run in `dir`, or `None` when git is missing or says no.
fn git(dir: &Path, args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .args(args)
        .current_dir(dir)
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let line = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (!line.is_empty()).then_some(line)
}

fn absolute(dir: &Path, path: &str) -> PathBuf {
    let p = PathBuf::from(path);
    if p.is_absolute() {
        p
    } else {
        dir.join(p)
    }
}
