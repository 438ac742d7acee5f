//! The optional TOML file: its values become clap defaults, so flags and environment
//! variables still win (flags > env > file > built-in default). `[[route]]` entries, which no
//! flag can say, are read into [`RouteSpec`]s for the relay.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use clap::Command;

mod keys;

/// Where `--config` / `TXOUTBOX_CONFIG` points, if anywhere (read before clap parses).
pub fn config_path(args: &[OsString]) -> Option<PathBuf> {
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let a = a.to_string_lossy();
        if a == "--config" {
            return it.next().map(PathBuf::from);
        }
        if let Some(v) = a.strip_prefix("--config=") {
            return Some(PathBuf::from(v));
        }
        if a == "--" {
            break;
        }
    }
    std::env::var_os("TXOUTBOX_CONFIG").map(PathBuf::from)
}

/// One `[[route]]` entry: which events (globs; a condition left out matches any value) go to
/// which publisher. Checked and connected by `txoutbox relay` (`cmd::relay`).
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteSpec {
    /// The route's name: the `route` label of its metrics, and how errors name it.
    pub name: String,
    /// Glob on the event type, e.g. `order.*`.
    pub event_type: Option<String>,
    /// Glob on the aggregate type.
    pub aggregate_type: Option<String>,
    /// Header name -> glob on its value; every one must be present and match.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// The publisher URL (as `--publisher`).
    pub publisher: Option<String>,
    /// A file holding the publisher URL, instead of `publisher` (as `--publisher-file`).
    pub publisher_file: Option<PathBuf>,
}

/// One `[[outbox]]` entry: an outbox of a relay process that runs several, each with its
/// own database, table, publisher or routes, and relay settings.
#[derive(Debug, Clone, PartialEq)]
pub struct OutboxSpec {
    /// The entry's name: the `outbox` label of its metrics, `--outbox NAME`, and how logs,
    /// the admin API and errors name it.
    pub name: String,
    /// Its settings as (option id, value), by option id; they win over flags, the
    /// environment and the file's top-level settings, which are defaults for what it leaves
    /// out.
    pub settings: Vec<(String, String)>,
    /// Its `[[outbox.route]]` entries.
    pub routes: Vec<RouteSpec>,
}

/// Options that belong to the process, not to one outbox: refused inside `[[outbox]]`.
const PROCESS_WIDE: &[&str] = &[
    "admin_addr",
    "admin_token",
    "admin_token_file",
    "metrics_interval",
    "retention_interval",
    "retention_batch",
    "drain",
    "config",
    "log_format",
    "outbox",
];

/// What the file says: its settings as defaults on the command, its routes and its outboxes.
pub struct FileSettings {
    pub command: Command,
    pub routes: Vec<RouteSpec>,
    pub outboxes: Vec<OutboxSpec>,
    /// (option id, how an error names it) for each setting the file gave: an invalid value
    /// is reported as the file's, not as the flag's ([`crate::origin`]).
    pub origins: Vec<(String, String)>,
}

/// Apply the file's settings as defaults on `cmd`. Top-level keys apply wherever an option of
/// that name exists; a `[relay]` (or other subcommand) table applies to that subcommand only;
/// `[[route]]` entries are returned, in order.
pub fn apply_file(mut cmd: Command, path: &Path) -> anyhow::Result<FileSettings> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("config file {}: cannot read", path.display()))?;
    let mut table: toml::Table = toml::from_str(&text).map_err(|e| {
        anyhow::anyhow!("config file {}: {}", path.display(), toml_error(&text, &e))
    })?;
    let mut origins = Vec::new();
    let routes = match table.remove("route") {
        Some(value) => routes(path, "[[route]]", value)?,
        None => Vec::new(),
    };
    let outboxes = match table.remove("outbox") {
        Some(value) => outboxes(path, &cmd, value)?,
        None => Vec::new(),
    };
    if !outboxes.is_empty() && !routes.is_empty() {
        bail!(
            "config file {}: with [[outbox]] entries, routes belong to an outbox: write them \
             as [[outbox.route]] under the [[outbox]] they are for",
            path.display()
        );
    }
    let file = format!("config file {}", path.display());
    let mut top = toml::Table::new();
    for (key, value) in table {
        let toml::Value::Table(section) = value else {
            top.insert(key, value);
            continue;
        };
        let Some(sub) = cmd.find_subcommand(&key).map(|s| s.get_name().to_string()) else {
            bail!("{file}: unknown section [{key}]");
        };
        for (id, v) in keys::read(&file, &format!("{key}."), section)? {
            let has = cmd
                .find_subcommand(&sub)
                .is_some_and(|s| s.get_arguments().any(|a| a.get_id() == id.as_str()));
            if !has {
                bail!("{file}: `{key}.{id}` is not a setting of `txoutbox {sub}`");
            }
            cmd = cmd.mut_subcommand(&sub, |s| s.mut_arg(&id, |a| a.default_value(v.clone())));
            origins.push((id.clone(), format!("`{key}.{id}` in {file}")));
        }
    }
    for (id, v) in keys::read(&file, "", top)? {
        let mut found = false;
        if cmd.get_arguments().any(|a| a.get_id() == id.as_str()) {
            cmd = cmd.mut_arg(&id, |a| a.default_value(v.clone()));
            found = true;
        }
        let subs: Vec<String> = cmd
            .get_subcommands()
            .filter(|s| s.get_arguments().any(|a| a.get_id() == id.as_str()))
            .map(|s| s.get_name().to_string())
            .collect();
        for sub in subs {
            cmd = cmd.mut_subcommand(&sub, |s| s.mut_arg(&id, |a| a.default_value(v.clone())));
            found = true;
        }
        if !found {
            bail!("{file}: unknown setting `{id}`");
        }
        origins.push((id.clone(), format!("`{id}` in {file}")));
    }
    Ok(FileSettings {
        command: cmd,
        routes,
        outboxes,
        origins,
    })
}

/// The `[[outbox]]` array: each entry named, its keys checked against the options an outbox
/// may set (database, schema, table, publisher, source, relay settings).
fn outboxes(path: &Path, cmd: &Command, value: toml::Value) -> anyhow::Result<Vec<OutboxSpec>> {
    let toml::Value::Array(entries) = value else {
        bail!(
            "config file {}: `outbox` must be an array of tables, written [[outbox]] (one per \
             outbox)",
            path.display()
        );
    };
    let allowed = outbox_options(cmd);
    let mut out: Vec<OutboxSpec> = Vec::with_capacity(entries.len());
    for (i, entry) in entries.into_iter().enumerate() {
        let toml::Value::Table(mut entry) = entry else {
            bail!(
                "config file {}: [[outbox]] number {} must be a table",
                path.display(),
                i + 1
            );
        };
        let at = |name: &str| {
            let name = if name.is_empty() {
                String::new()
            } else {
                format!(" (`{name}`)")
            };
            format!(
                "config file {}: [[outbox]] number {}{name}",
                path.display(),
                i + 1
            )
        };
        let name = match entry.remove("name") {
            Some(toml::Value::String(n)) => n,
            Some(other) => bail!(
                "{}: `name` must be a string, not {}",
                at(""),
                other.type_str()
            ),
            None => bail!(
                "{}: it needs a `name` (its metrics label and --outbox NAME)",
                at("")
            ),
        };
        if !txoutbox::publish::route::is_route_name(&name) {
            bail!(
                "{}: the name must be 1 to 64 of A-Z a-z 0-9 _ . - (it is a metrics label)",
                at(&name)
            );
        }
        if out.iter().any(|o| o.name == name) {
            bail!(
                "{}: another outbox has this name: names must be unique",
                at(&name)
            );
        }
        let routes = match entry.remove("route") {
            Some(value) => routes(
                path,
                &format!("[[outbox]] `{name}` [[outbox.route]]"),
                value,
            )?,
            None => Vec::new(),
        };
        for key in entry.keys() {
            let id = key.replace('-', "_");
            if PROCESS_WIDE.contains(&id.as_str()) {
                bail!(
                    "{}: `{key}` is the process's, not one outbox's: set it at the top level or \
                     under [relay]",
                    at(&name)
                );
            }
            if !allowed.contains(&id) {
                bail!(
                    "{}: unknown setting `{key}` (an outbox takes name, route and: {})",
                    at(&name),
                    allowed.join(", ")
                );
            }
        }
        let settings = keys::read(&at(&name), "", entry)?;
        out.push(OutboxSpec {
            name,
            settings,
            routes,
        });
    }
    Ok(out)
}

/// The options an `[[outbox]]` entry may set: the database (global options) and the
/// relay's, without the process-wide ones.
fn outbox_options(cmd: &Command) -> Vec<String> {
    let global = cmd.get_arguments().map(|a| a.get_id().to_string());
    let relay = cmd
        .find_subcommand("relay")
        .into_iter()
        .flat_map(|s| s.get_arguments().map(|a| a.get_id().to_string()));
    let mut ids: Vec<String> = global
        .chain(relay)
        .filter(|id| !PROCESS_WIDE.contains(&id.as_str()) && id != "help" && id != "version")
        .collect();
    ids.sort();
    ids.dedup();
    ids
}

/// `cmd` with `spec`'s settings as the values of their options: defaults that no environment
/// variable replaces (an outbox's own setting wins over the environment). A flag on the
/// command line for one of them is refused by [`outbox_conflicts`].
pub fn outbox_command(mut cmd: Command, spec: &OutboxSpec) -> Command {
    // An outbox's `publisher` rules out a `publisher_file` from anywhere else (and so on):
    // the other half of the pair has no value but the command line's, which is refused.
    for (id, _) in &spec.settings {
        if let Some(other) = other_half(id) {
            cmd = set_everywhere(cmd, other, |a| a.default_value(None).env(None));
        }
    }
    for (id, v) in &spec.settings {
        cmd = set_everywhere(cmd, id, |a| a.default_value(v.clone()).env(None));
    }
    cmd
}

/// The option given instead of `id` (a value or the file holding it), if any.
fn other_half(id: &str) -> Option<&'static str> {
    match id {
        "database_url" => Some("database_url_file"),
        "database_url_file" => Some("database_url"),
        "publisher" => Some("publisher_file"),
        "publisher_file" => Some("publisher"),
        _ => None,
    }
}

/// `change` applied to the option `id` of `cmd` and of each subcommand that has it.
fn set_everywhere(mut cmd: Command, id: &str, change: impl Fn(clap::Arg) -> clap::Arg) -> Command {
    if cmd.get_arguments().any(|a| a.get_id() == id) {
        cmd = cmd.mut_arg(id, &change);
    }
    let subs: Vec<String> = cmd
        .get_subcommands()
        .filter(|s| s.get_arguments().any(|a| a.get_id() == id))
        .map(|s| s.get_name().to_string())
        .collect();
    for sub in subs {
        cmd = cmd.mut_subcommand(&sub, |s| s.mut_arg(id, &change));
    }
    cmd
}

/// The options that `spec` sets and the command line sets too: which one was meant is not
/// clear, so the command is refused (an outbox's settings are its own).
pub fn outbox_conflicts(
    cmd: &Command,
    matches: &clap::ArgMatches,
    spec: &OutboxSpec,
) -> Vec<(String, String)> {
    let sub = matches
        .subcommand()
        .and_then(|(name, m)| cmd.find_subcommand(name).map(|c| (c, m)));
    let given = |id: &str| {
        let on_root = cmd.get_arguments().any(|a| a.get_id() == id)
            && matches.value_source(id) == Some(clap::parser::ValueSource::CommandLine);
        let on_sub = sub.is_some_and(|(c, m)| {
            c.get_arguments().any(|a| a.get_id() == id)
                && m.value_source(id) == Some(clap::parser::ValueSource::CommandLine)
        });
        on_root || on_sub
    };
    spec.settings
        .iter()
        .flat_map(|(id, _)| {
            std::iter::once(id.as_str())
                .chain(other_half(id))
                .filter(|flag| given(flag))
                .map(move |flag| (id.clone(), flag.to_string()))
        })
        .collect()
}

/// A `[[route]]` array (`what`: how errors name it); each entry's error names it (by number,
/// and by name when it has one).
fn routes(path: &Path, what: &str, value: toml::Value) -> anyhow::Result<Vec<RouteSpec>> {
    let toml::Value::Array(entries) = value else {
        bail!(
            "config file {}: `route` must be an array of tables, written {what} (one per route)",
            path.display()
        );
    };
    let mut out = Vec::with_capacity(entries.len());
    for (i, entry) in entries.into_iter().enumerate() {
        let name = entry
            .get("name")
            .and_then(|n| n.as_str())
            .map(|n| format!(" (`{n}`)"))
            .unwrap_or_default();
        let spec: RouteSpec = entry.try_into().map_err(|e: toml::de::Error| {
            anyhow::anyhow!(
                "config file {}: {what} number {}{name}: {}",
                path.display(),
                i + 1,
                e.to_string().trim_end()
            )
        })?;
        out.push(spec);
    }
    Ok(out)
}

/// Where a TOML syntax error is, and what is wrong, without the line itself: a value on it
/// may be a secret (`admin_token = "...`), and the parser's excerpt would show it.
fn toml_error(text: &str, e: &toml::de::Error) -> String {
    let what = e.message().trim_end();
    match e.span() {
        Some(span) => {
            let before = &text[..span.start.min(text.len())];
            let line = before.matches('\n').count() + 1;
            let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
            format!("not valid TOML at line {line}, column {column}: {what}")
        }
        None => format!("not valid TOML: {what}"),
    }
}

#[cfg(test)]
mod tests;
