//! The config file's settings as a type: [`Keys`] names every key a file may set and the TOML
//! type its value takes. The top level, each `[section]` and each `[[outbox]]` entry are read
//! into it: a key it does not name is refused (with the nearest name it does), and so is a
//! value of the wrong type, naming the file and the key, before any value is used. The values
//! then become clap defaults (`super::apply_file`), so the options' own checks (ranges, the
//! duration grammar, enum names) apply to them as to flags, and name the file and key too
//! (`crate::origin`).

use std::fmt;
use std::path::PathBuf;

use anyhow::bail;
use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, Serialize};

/// Every setting a config file may give, by its key. A test keeps it in step with the options
/// of the commands a file configures (the global ones, `relay` and `demo`): an option added
/// to those needs its key here.
#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Keys {
    // Database: every command.
    database_url: Option<String>,
    database_url_file: Option<PathBuf>,
    schema: Option<String>,
    table: Option<String>,
    log_format: Option<String>,
    // Publisher and source.
    publisher: Option<String>,
    publisher_file: Option<PathBuf>,
    source: Option<String>,
    slot: Option<String>,
    // Tuning, retries and ordering.
    batch_size: Option<Count>,
    max_in_flight: Option<Count>,
    max_batch_bytes: Option<Size>,
    max_in_flight_bytes: Option<Size>,
    max_event_bytes: Option<Size>,
    poll_interval: Option<Span>,
    lease: Option<Span>,
    max_attempts: Option<Count>,
    backoff_base: Option<Span>,
    backoff_max: Option<Span>,
    shutdown_timeout: Option<Span>,
    retention_period: Option<Span>,
    relay_id: Option<String>,
    mode: Option<String>,
    on_dead_letter: Option<String>,
    partition_lease: Option<Span>,
    pipeline: Option<Count>,
    inject_faults: Option<f64>,
    drain: Option<bool>,
    // The process: admin listener and retention.
    admin_addr: Option<String>,
    admin_token: Option<String>,
    admin_token_file: Option<PathBuf>,
    metrics_interval: Option<Span>,
    retention_interval: Option<Span>,
    retention_batch: Option<Count>,
    // `demo`.
    orders: Option<Count>,
}

/// Keys whose values are secrets, or hold them (a URL's password): an error about one never
/// quotes its value.
const SECRET: &[&str] = &["database_url", "publisher", "admin_token"];

/// The settings of one table of the file: its keys (`-` read as `_`) checked against
/// [`Keys`], its values against their types; returned as (option id, value as clap takes it),
/// in key order. Errors begin with `place` (`config file x.toml`, or that and the
/// `[[outbox]]` entry) and name the key with `at` before it (`relay.` for `[relay]`).
pub fn read(place: &str, at: &str, table: toml::Table) -> anyhow::Result<Vec<(String, String)>> {
    let file = place;
    let mut keys = toml::Table::new();
    for (key, value) in table {
        let id = key.replace('-', "_");
        if !fields().contains(&id.as_str()) {
            let hint = nearest(&id)
                .map(|n| format!(" (did you mean `{n}`?)"))
                .unwrap_or_default();
            bail!("{file}: unknown setting `{at}{key}`{hint}");
        }
        if keys.insert(id.clone(), value).is_some() {
            bail!("{file}: `{at}{id}` is set twice (as `{key}` and with `_`)");
        }
    }
    let typed: Keys = serde_path_to_error::deserialize(toml::Value::Table(keys)).map_err(|e| {
        let key = e.path().to_string();
        let why = if SECRET.contains(&key.as_str()) {
            // serde's message quotes the value, which may be a secret.
            "must be a string".to_string()
        } else {
            e.inner().to_string()
        };
        anyhow::anyhow!("{file}: `{at}{key}`: {}", first_line(&why))
    })?;
    typed.settings()
}

impl Keys {
    /// The settings given, as (option id, value as clap takes it).
    fn settings(&self) -> anyhow::Result<Vec<(String, String)>> {
        let table = toml::Table::try_from(self)?;
        Ok(table
            .into_iter()
            .map(|(id, value)| {
                let value = match value {
                    toml::Value::String(s) => s,
                    other => other.to_string(),
                };
                (id, value)
            })
            .collect())
    }
}

/// The keys [`Keys`] names.
pub fn fields() -> &'static [&'static str] {
    /// A deserializer that only records the fields a struct asks for.
    struct Fields(&'static [&'static str]);
    impl<'de> Deserializer<'de> for &mut Fields {
        type Error = de::value::Error;
        fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Self::Error> {
            Err(de::Error::custom("not a struct"))
        }
        fn deserialize_struct<V: Visitor<'de>>(
            self,
            _: &'static str,
            fields: &'static [&'static str],
            _: V,
        ) -> Result<V::Value, Self::Error> {
            self.0 = fields;
            Err(de::Error::custom("fields recorded"))
        }
        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes
            byte_buf option unit unit_struct newtype_struct seq tuple tuple_struct map enum
            identifier ignored_any
        }
    }
    let mut fields = Fields(&[]);
    let _ = Keys::deserialize(&mut fields);
    fields.0
}

/// The key of [`Keys`] nearest to `key`, when one is near enough to be a typo of it.
fn nearest(key: &str) -> Option<&'static str> {
    fields()
        .iter()
        .map(|f| (strsim::jaro_winkler(key, f), *f))
        .filter(|(score, _)| *score > 0.8)
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, f)| f)
}

/// serde's message without the `in `key`` line the path adds.
fn first_line(s: &str) -> &str {
    s.lines().next().unwrap_or_default()
}

/// A whole number, 0 or more (`batch_size = 500`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(transparent)]
struct Count(u64);

impl<'de> Deserialize<'de> for Count {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Count;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a whole number, 0 or more (written without quotes)")
            }
            fn visit_u64<E: de::Error>(self, n: u64) -> Result<Count, E> {
                Ok(Count(n))
            }
            fn visit_i64<E: de::Error>(self, n: i64) -> Result<Count, E> {
                u64::try_from(n)
                    .map(Count)
                    .map_err(|_| E::invalid_value(de::Unexpected::Signed(n), &self))
            }
        }
        d.deserialize_any(V)
    }
}

/// A duration: a string in the duration grammar (`"500ms"`, `"1m30s"`, `"7d"`) or a number
/// of seconds (`0.5`, `30`). The grammar and the setting's range are checked where flags'
/// values are (`txoutbox::duration`), with the file and key named.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(transparent)]
struct Span(String);

impl<'de> Deserialize<'de> for Span {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(Text {
            what: "a duration: a string such as \"500ms\", \"5s\" or \"1m30s\", or a number of \
                   seconds",
            floats: true,
        })
        .map(Span)
    }
}

/// A size in bytes: a number of bytes (`65536`) or a string with a unit (`"16MiB"`), checked
/// where the flag's value is.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(transparent)]
struct Size(String);

impl<'de> Deserialize<'de> for Size {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(Text {
            what: "a size: a string such as \"16MiB\", or a number of bytes",
            floats: false,
        })
        .map(Size)
    }
}

/// A string, or a number 0 or more (a float only where `floats`), kept as text.
struct Text {
    what: &'static str,
    floats: bool,
}

impl Visitor<'_> for Text {
    type Value = String;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(self.what)
    }
    fn visit_str<E: de::Error>(self, s: &str) -> Result<String, E> {
        Ok(s.to_string())
    }
    fn visit_u64<E: de::Error>(self, n: u64) -> Result<String, E> {
        Ok(n.to_string())
    }
    fn visit_i64<E: de::Error>(self, n: i64) -> Result<String, E> {
        if n < 0 {
            return Err(E::invalid_value(de::Unexpected::Signed(n), &self));
        }
        Ok(n.to_string())
    }
    fn visit_f64<E: de::Error>(self, f: f64) -> Result<String, E> {
        if !self.floats || !f.is_finite() || f < 0.0 {
            return Err(E::invalid_value(de::Unexpected::Float(f), &self));
        }
        Ok(f.to_string())
    }
}
