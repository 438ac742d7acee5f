//! SQL identifiers from configuration: validated, then always quoted.

use std::fmt;

/// Longest table name accepted: PostgreSQL's 63-byte limit minus room for the suffixes of the
/// objects named after the table (`_pending`, `_waiters`, ...).
pub const MAX_TABLE_LEN: usize = 40;
/// Longest schema name accepted (PostgreSQL's own limit).
pub const MAX_SCHEMA_LEN: usize = 63;

/// A validated SQL identifier: ASCII letter or `_` first, then letters, digits or `_`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Ident(String);

/// An identifier from configuration was refused.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
#[error("invalid {what} {value:?}: {reason}")]
pub struct IdentError {
    /// What the identifier was for (e.g. `schema`, `table`).
    pub what: &'static str,
    /// The refused value, as given.
    pub value: String,
    /// Which rule it broke.
    pub reason: String,
}

impl Ident {
    /// Validate `value` as an identifier named `what` (for the error), at most `max` bytes.
    pub fn new(what: &'static str, value: &str, max: usize) -> Result<Self, IdentError> {
        let err = |reason: String| IdentError {
            what,
            value: value.to_string(),
            reason,
        };
        let mut chars = value.chars();
        match chars.next() {
            None => return Err(err("must not be empty".into())),
            Some(c) if c.is_ascii_alphabetic() || c == '_' => {}
            Some(_) => return Err(err("must start with a letter or `_`".into())),
        }
        if let Some(c) = value
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || *c == '_'))
        {
            return Err(err(format!(
                "may contain only letters, digits and `_` (found {c:?})"
            )));
        }
        if value.len() > max {
            return Err(err(format!("is longer than {max} characters")));
        }
        Ok(Self(value.to_string()))
    }

    /// The identifier unquoted, as validated.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The identifier double-quoted for SQL (validation already excluded `"`).
    pub fn quoted(&self) -> String {
        format!("\"{}\"", self.0)
    }
}

impl fmt::Display for Ident {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Is `name` a name PostgreSQL takes for a replication slot (and the WAL source for its
/// publication): 1 to 63 of `a-z`, `0-9` and `_`?
pub fn is_slot_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_plain_names() {
        for ok in ["outbox_events", "_x", "A1", "public"] {
            assert_eq!(Ident::new("table", ok, 40).unwrap().as_str(), ok);
        }
    }

    #[test]
    fn refuses_injection_and_oddities() {
        for bad in [
            "",
            "outbox; DROP TABLE x",
            "a\"b",
            "1abc",
            "a-b",
            "a.b",
            "ünïcode",
            "x ",
        ] {
            let e = Ident::new("table", bad, 40).unwrap_err();
            assert!(e.to_string().starts_with("invalid table"), "{e}");
        }
        assert!(Ident::new("table", &"a".repeat(41), 40).is_err());
    }
}
