//! The config file read into settings, routes and outboxes, with its errors.

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

/// [`keys::Keys`] is the file's schema: it names exactly the options of the commands a file
/// configures (the global ones, `relay` and `demo`), so an option added there without a key
/// fails here.
#[test]
fn the_files_keys_are_the_options_it_configures() {
    let cmd = Cli::command();
    let ids = |c: &clap::Command| -> Vec<String> {
        c.get_arguments().map(|a| a.get_id().to_string()).collect()
    };
    let mut options: Vec<String> = ids(&cmd)
        .into_iter()
        .chain(
            ["relay", "demo"]
                .iter()
                .flat_map(|s| cmd.find_subcommand(s).map(ids).unwrap_or_default()),
        )
        .filter(|id| !["help", "version", "config", "outbox"].contains(&id.as_str()))
        .collect();
    options.sort();
    options.dedup();
    let mut keys: Vec<String> = keys::fields().iter().map(|k| k.to_string()).collect();
    keys.sort();
    assert_eq!(keys, options);
}

/// A value of the wrong type is refused naming the file and the key (and for a secret's
/// key, without the value); a number, a size or a duration may be written as TOML numbers.
#[test]
fn values_are_typed_and_a_wrong_type_names_the_key() {
    let e = |f: &str| load(f).err().map(|e| format!("{e:#}")).unwrap_or_default();
    let err = e("batch_size = \"500\"\n");
    assert!(
        err.contains("config file")
            && err.contains("`batch_size`: invalid type: string \"500\"")
            && err.contains("whole number"),
        "{err}"
    );
    let err = e("[relay]\ndrain = \"yes\"\n");
    assert!(
        err.contains("`relay.drain`") && err.contains("boolean"),
        "{err}"
    );
    let err = e("[relay]\npoll_interval = true\n");
    assert!(
        err.contains("`relay.poll_interval`") && err.contains("duration"),
        "{err}"
    );
    let err = e("[relay]\nmax_batch_bytes = -1\n");
    assert!(
        err.contains("`relay.max_batch_bytes`") && err.contains("size"),
        "{err}"
    );
    let err = e("lease = inf\n");
    assert!(err.contains("`lease`") && err.contains("`inf`"), "{err}");
    for secret in [
        "admin_token = 123456789",
        "database_url = 987654321",
        "publisher = 55555",
    ] {
        let err = e(&format!("{secret}\n"));
        let (key, value) = secret.split_once(" = ").unwrap();
        assert!(err.contains(&format!("`{key}`: must be a string")), "{err}");
        assert!(!err.contains(value), "{err}");
    }
    let err = e("[[outbox]]\nname = \"a\"\nbatch-size = -3\n");
    assert!(
        err.contains("[[outbox]] number 1 (`a`)") && err.contains("`batch_size`"),
        "{err}"
    );
    let cli = parse(
        "[relay]\npoll_interval = 0.5\nlease = 30\nmax_batch_bytes = 65536\nmax_event_bytes = \"1MiB\"\ndrain = true\ninject_faults = 0\n",
        &["txoutbox", "relay", "--publisher", "null:"],
    )
    .unwrap();
    let Cmd::Relay(r) = cli.command else { panic!() };
    assert_eq!(
        r.tuning.poll_interval,
        std::time::Duration::from_millis(500)
    );
    assert_eq!(r.tuning.lease, std::time::Duration::from_secs(30));
    assert_eq!(r.tuning.max_batch_bytes, 65536);
    assert_eq!(r.tuning.max_event_bytes, 1 << 20);
    assert!(r.drain);
}

/// An unknown key says which key it may have meant; a key written twice (`-` and `_`) and a
/// key in a section whose command has no such option are refused.
#[test]
fn unknown_and_misplaced_keys_are_refused_with_a_hint() {
    let e = |f: &str| load(f).err().map(|e| format!("{e:#}")).unwrap_or_default();
    let err = e("[relay]\nbatch_sise = 3\n");
    assert!(
        err.contains("unknown setting `relay.batch_sise` (did you mean `batch_size`?)"),
        "{err}"
    );
    let err = e("json = true\n");
    assert!(
        err.contains("unknown setting `json`") && !err.contains("did you"),
        "{err}"
    );
    let err = e("batch-size = 3\nbatch_size = 4\n");
    assert!(err.contains("`batch_size` is set twice"), "{err}");
    let err = e("[status]\nbatch_size = 3\n");
    assert!(
        err.contains("`status.batch_size` is not a setting of `txoutbox status`"),
        "{err}"
    );
}
