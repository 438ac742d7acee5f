//! The optional TOML file: its values become clap defaults, so flags and environment
//! variables still win (flags > env > file > built-in default). `[[route]]` entries, which no
//! flag can say, are read into [`RouteSpec`]s for the relay.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use clap::Command;

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
    for (key, value) in table {
        if let toml::Value::Table(section) = value {
            let Some(sub) = cmd.find_subcommand(&key).map(|s| s.get_name().to_string()) else {
                bail!("config file {}: unknown section [{key}]", path.display());
            };
            for (k, v) in section {
                let (id, v) = setting(path, &format!("{key}.{k}"), &k, v)?;
                let has = cmd
                    .find_subcommand(&sub)
                    .is_some_and(|s| s.get_arguments().any(|a| a.get_id() == id.as_str()));
                if !has {
                    bail!(
                        "config file {}: unknown setting `{key}.{k}`",
                        path.display()
                    );
                }
                cmd = cmd.mut_subcommand(&sub, |s| s.mut_arg(&id, |a| a.default_value(v.clone())));
                origins.push((id, format!("`{key}.{k}` in config file {}", path.display())));
            }
        } else {
            let (id, v) = setting(path, &key, &key, value)?;
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
                bail!("config file {}: unknown setting `{key}`", path.display());
            }
            origins.push((id, format!("`{key}` in config file {}", path.display())));
        }
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
        let mut settings = Vec::new();
        for (k, v) in entry {
            let (id, v) = setting(path, &format!("outbox `{name}`: {k}"), &k, v)?;
            if PROCESS_WIDE.contains(&id.as_str()) {
                bail!(
                    "{}: `{k}` is the process's, not one outbox's: set it at the top level or \
                     under [relay]",
                    at(&name)
                );
            }
            if !allowed.contains(&id) {
                bail!(
                    "{}: unknown setting `{k}` (an outbox takes name, route and: {})",
                    at(&name),
                    allowed.join(", ")
                );
            }
            settings.push((id, v));
        }
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

fn setting(path: &Path, full: &str, key: &str, v: toml::Value) -> anyhow::Result<(String, String)> {
    let id = key.replace('-', "_");
    let v = match v {
        toml::Value::String(s) => s,
        toml::Value::Integer(i) => i.to_string(),
        toml::Value::Float(f) => f.to_string(),
        toml::Value::Boolean(b) => b.to_string(),
        other => bail!(
            "config file {}: setting `{full}` must be a string, number or boolean, not {}",
            path.display(),
            other.type_str()
        ),
    };
    Ok((id, v))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{Cli, Command as Cmd};
    use clap::{CommandFactory, FromArgMatches};

    /// `file` written to a temporary path and applied to the CLI's command.
    fn load(file: &str) -> anyhow::Result<FileSettings> {
        let dir = std::env::temp_dir().join(format!("txoutbox-cfg-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir)?;
        let path = dir.join("c.toml");
        std::fs::write(&path, file)?;
        let loaded = apply_file(Cli::command(), &path);
        std::fs::remove_dir_all(&dir)?;
        loaded
    }

    fn parse(file: &str, args: &[&str]) -> anyhow::Result<Cli> {
        let m = load(file)?.command.try_get_matches_from(args)?;
        Ok(Cli::from_arg_matches(&m)?)
    }

    fn routes_of(file: &str) -> anyhow::Result<Vec<RouteSpec>> {
        Ok(load(file)?.routes)
    }

    #[test]
    fn routes_are_read_in_order_beside_the_other_settings() {
        let routes = routes_of(
            r#"
schema = "app"
[relay]
publisher = "null:"

[[route]]
name = "orders"
event_type = "order.*"
publisher = "kafka://127.0.0.1:9092?topic=orders"

[[route]]
name = "audit"
aggregate_type = "user"
headers = { audit = "yes", tenant = "acme-*" }
publisher_file = "/run/secrets/sqs"
"#,
        )
        .unwrap();
        assert_eq!(routes.len(), 2);
        assert_eq!(routes[0].name, "orders");
        assert_eq!(routes[0].event_type.as_deref(), Some("order.*"));
        assert_eq!(routes[0].aggregate_type, None);
        assert_eq!(routes[1].headers.len(), 2);
        assert_eq!(routes[1].headers["tenant"], "acme-*");
        assert_eq!(
            routes[1].publisher_file.as_deref(),
            Some(Path::new("/run/secrets/sqs"))
        );
        assert!(routes_of("schema = \"app\"\n").unwrap().is_empty());
    }

    #[test]
    fn a_bad_route_entry_is_named() {
        let e = routes_of("[[route]]\nname = \"a\"\npublisher = \"null:\"\n[[route]]\nname = \"b\"\nevnt_type = \"x\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("[[route]] number 2 (`b`)"), "{e}");
        assert!(e.contains("evnt_type"), "{e}");
        let e = routes_of("[[route]]\nevent_type = \"x\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("number 1") && e.contains("name"), "{e}");
        let e = routes_of("route = \"x\"\n").unwrap_err().to_string();
        assert!(e.contains("[[route]]"), "{e}");
        let e = routes_of("[[route]]\nname = \"a\"\nheaders = { x = 1 }\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("(`a`)") && e.contains("headers.x"), "{e}");
        let e = routes_of("[[route]]\nname = \"a\"\nevent_type = 5\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("event_type"), "{e}");
    }

    #[test]
    fn outboxes_are_read_with_their_routes_and_settings() {
        let file = load(
            r#"
batch_size = 7
[[outbox]]
name = "a"
schema = "s_a"
batch-size = 3
publisher = "null:"
[[outbox]]
name = "b"
database_url = "sqlite:///tmp/b.db"
[[outbox.route]]
name = "r1"
event_type = "x.*"
publisher = "stdout:"
"#,
        )
        .unwrap();
        assert!(file.routes.is_empty());
        let [a, b] = &file.outboxes[..] else {
            panic!("{:?}", file.outboxes)
        };
        assert_eq!(a.name, "a");
        assert_eq!(
            a.settings,
            [
                ("batch_size".to_string(), "3".to_string()),
                ("publisher".to_string(), "null:".to_string()),
                ("schema".to_string(), "s_a".to_string())
            ]
        );
        assert!(a.routes.is_empty());
        assert_eq!(b.routes.len(), 1);
        assert_eq!(b.routes[0].event_type.as_deref(), Some("x.*"));
        // The entry's value, then the file's top level, beneath flags on other keys.
        let cmd = outbox_command(file.command.clone(), a);
        let m = cmd
            .clone()
            .try_get_matches_from(["txoutbox", "relay", "--max-in-flight", "5"])
            .unwrap();
        assert!(outbox_conflicts(&cmd, &m, a).is_empty());
        let cli = Cli::from_arg_matches(&m).unwrap();
        assert_eq!(cli.global.schema, "s_a");
        let Cmd::Relay(r) = cli.command else { panic!() };
        assert_eq!((r.tuning.batch_size, r.tuning.max_in_flight), (3, 5));
        let cli = Cli::from_arg_matches(
            &outbox_command(file.command.clone(), b)
                .try_get_matches_from(["txoutbox", "relay"])
                .unwrap(),
        )
        .unwrap();
        let Cmd::Relay(r) = cli.command else { panic!() };
        assert_eq!(r.tuning.batch_size, 7);
        // A flag for what the entry sets is a conflict.
        let m = cmd
            .clone()
            .try_get_matches_from(["txoutbox", "--schema", "z", "relay", "--batch-size", "9"])
            .unwrap();
        let both: Vec<(String, String)> = ["batch_size", "schema"]
            .iter()
            .map(|k| (k.to_string(), k.to_string()))
            .collect();
        assert_eq!(outbox_conflicts(&cmd, &m, a), both);
        // The other half of a pair counts too, and no other source gives it.
        let m = cmd
            .clone()
            .try_get_matches_from(["txoutbox", "relay", "--publisher-file", "/p"])
            .unwrap();
        assert_eq!(
            outbox_conflicts(&cmd, &m, a),
            [("publisher".to_string(), "publisher_file".to_string())]
        );
    }

    #[test]
    fn a_bad_outbox_entry_is_named() {
        let e = |f: &str| load(f).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(e("outbox = 1\n").contains("[[outbox]]"));
        assert!(e("[[outbox]]\nschema = \"x\"\n").contains("needs a `name`"));
        assert!(e("[[outbox]]\nname = \"a b\"\n").contains("1 to 64"));
        let err = e("[[outbox]]\nname = \"a\"\nmetrics_interval = \"1s\"\n");
        assert!(
            err.contains("(`a`)") && err.contains("the process's"),
            "{err}"
        );
        let err = e("[[outbox]]\nname = \"a\"\nfoo = 1\n");
        assert!(
            err.contains("unknown setting `foo`") && err.contains("batch_size"),
            "{err}"
        );
        let err = e("[[route]]\nname = \"r\"\npublisher = \"null:\"\n[[outbox]]\nname = \"a\"\n");
        assert!(err.contains("[[outbox.route]]"), "{err}");
    }

    #[test]
    fn file_values_are_defaults_and_flags_win() {
        let cli = parse(
            "schema = \"app\"\n[relay]\nbatch_size = 7\npublisher = \"null:\"\n",
            &["txoutbox", "relay", "--batch-size", "9"],
        )
        .unwrap();
        assert_eq!(cli.global.schema, "app");
        let Cmd::Relay(r) = cli.command else { panic!() };
        assert_eq!(r.tuning.batch_size, 9);
        assert_eq!(r.publisher.as_deref(), Some("null:"));
    }

    #[test]
    fn source_and_slot_come_from_the_file_and_flags_win() {
        use txoutbox::relay::Source;
        let file = "[relay]\nsource = \"wal\"\nslot = \"s1\"\n";
        let cli = parse(file, &["txoutbox", "relay"]).unwrap();
        let Cmd::Relay(r) = cli.command else { panic!() };
        assert_eq!((r.source, r.slot.as_deref()), (Source::Wal, Some("s1")));
        let cli = parse(
            file,
            &["txoutbox", "relay", "--source", "table", "--slot", "s2"],
        )
        .unwrap();
        let Cmd::Relay(r) = cli.command else { panic!() };
        assert_eq!((r.source, r.slot.as_deref()), (Source::Table, Some("s2")));
        let e = parse("[relay]\nslot = \"No\"\n", &["txoutbox", "relay"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("replication slot name"), "{e}");
    }

    /// A syntax error says where, never what the line holds (a value may be a secret).
    #[test]
    fn a_toml_syntax_error_names_the_place_not_the_line() {
        for file in [
            "schema = \"app\"\nadmin_token = \"s3cr3t\n",
            "admin_token = \"s3cr3t\" x\n",
            "[relay]\nadmin_token=s3cr3t\n",
        ] {
            let e = load(file).err().map(|e| e.to_string()).unwrap_or_default();
            assert!(e.contains("not valid TOML at line"), "{file:?}: {e}");
            assert!(!e.contains("s3cr3t"), "{file:?}: {e}");
        }
        let e = load("a = 1\nb = = 2\n")
            .err()
            .map(|e| e.to_string())
            .unwrap();
        assert!(e.contains("line 2, column 5"), "{e}");
    }

    #[test]
    fn unknown_keys_are_named() {
        let e = parse("batch_sise = 3\n", &["txoutbox", "status"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("batch_sise"), "{e}");
        let e = parse("[relay]\nfoo = 1\n", &["txoutbox", "status"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("relay.foo"), "{e}");
    }
}
