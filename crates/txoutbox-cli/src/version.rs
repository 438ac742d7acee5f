//! What this binary is: its version and the commit it was built from (`build.rs`), for
//! `--version`, the man page and the `txoutbox_build_info` metric.

/// The crate's version, e.g. `0.1.0`.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The commit's short hash, `-dirty` when tracked files had changes, or `unknown` (built
/// outside a git checkout without `TXOUTBOX_BUILD_COMMIT`).
pub const COMMIT: &str = env!("TXOUTBOX_COMMIT");

/// `--version`'s text after the name: `0.1.0 (commit 0123456789)`.
pub const LONG: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("TXOUTBOX_COMMIT"),
    ")"
);
