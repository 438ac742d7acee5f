//! Where the outbox lives: a validated schema and table name, and every name derived from them.

use crate::ident::{Ident, IdentError, MAX_SCHEMA_LEN, MAX_TABLE_LEN};

/// The outbox's schema and table, validated. Defaults to `public.outbox_events`, the seed's.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct OutboxTable {
    schema: Ident,
    table: Ident,
}

impl Default for OutboxTable {
    fn default() -> Self {
        Self {
            schema: Ident::new("schema", "public", MAX_SCHEMA_LEN).expect("valid"),
            table: Ident::new("table", "outbox_events", MAX_TABLE_LEN).expect("valid"),
        }
    }
}

impl OutboxTable {
    /// Validate a schema and table name (letters, digits, `_`; no quoting tricks).
    pub fn new(schema: &str, table: &str) -> Result<Self, IdentError> {
        Ok(Self {
            schema: Ident::new("schema", schema, MAX_SCHEMA_LEN)?,
            table: Ident::new("table", table, MAX_TABLE_LEN)?,
        })
    }

    /// The schema: a PostgreSQL schema, a MySQL database (`public`: the connection's own); SQLite
    /// has none and accepts only `public` or `main`.
    pub fn schema(&self) -> &Ident {
        &self.schema
    }
    /// The table's name, at most [`MAX_TABLE_LEN`] bytes; the
    /// outbox's other objects are named after it.
    pub fn table(&self) -> &Ident {
        &self.table
    }

    /// `"schema"."table"`.
    pub fn qualified(&self) -> String {
        format!("{}.{}", self.schema.quoted(), self.table.quoted())
    }

    /// A schema-qualified, quoted object named after the table: `"schema"."table_suffix"`.
    /// For `dead_letters` the seed's name comes out: `outbox_events` -> `outbox_dead_letters`.
    pub fn derived(&self, suffix: &str) -> String {
        format!("{}.\"{}\"", self.schema.quoted(), self.derived_name(suffix))
    }

    /// An unqualified derived name (indexes, triggers), quoted.
    pub fn derived_unqualified(&self, suffix: &str) -> String {
        format!("\"{}\"", self.derived_name(suffix))
    }

    pub(crate) fn derived_name(&self, suffix: &str) -> String {
        let base = self.table.as_str();
        let base = base.strip_suffix("_events").unwrap_or(base);
        format!("{base}_{suffix}")
    }

    /// `schema.table` for humans.
    pub fn display(&self) -> String {
        format!("{}.{}", self.schema, self.table)
    }

    /// The prefix of this outbox's tableless events, the logical messages the WAL source
    /// delivers as its events (PostgreSQL): `txoutbox:<schema>.<table>`, with the names as
    /// validated (letters, digits and `_`). Messages of any other prefix (another outbox's,
    /// other software's) are not this outbox's and are skipped.
    pub fn tableless_prefix(&self) -> String {
        format!("txoutbox:{}.{}", self.schema, self.table)
    }

    /// The LISTEN/NOTIFY channel (at most 63 bytes, as PostgreSQL requires).
    pub fn channel(&self) -> String {
        let c = format!("txoutbox.{}.{}", self.schema, self.table);
        if c.len() <= 63 {
            return c;
        }
        format!("txoutbox.{:016x}", stable_hash(&c))
    }

    /// The seed's processed_events table of this schema (the inbox).
    pub fn processed_events(&self) -> String {
        format!("{}.processed_events", self.schema.quoted())
    }
}

/// FNV-1a of `s`: the same in every process and version (std's hasher is randomised), for
/// names that must be shortened to fit PostgreSQL's 63 bytes.
pub(crate) fn stable_hash(s: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in s.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derived_names_follow_the_seed() {
        let t = OutboxTable::default();
        assert_eq!(t.qualified(), "\"public\".\"outbox_events\"");
        assert_eq!(
            t.derived("dead_letters"),
            "\"public\".\"outbox_dead_letters\""
        );
        assert_eq!(t.channel(), "txoutbox.public.outbox_events");
        let t = OutboxTable::new("app", "events").unwrap();
        assert_eq!(t.derived("waiters"), "\"app\".\"events_waiters\"");
    }

    #[test]
    fn long_names_make_short_channels() {
        let t = OutboxTable::new(&"s".repeat(63), &"t".repeat(40)).unwrap();
        assert!(t.channel().len() <= 63, "{}", t.channel());
        assert_eq!(t.channel(), t.clone().channel());
    }

    #[test]
    fn refuses_injection() {
        assert!(OutboxTable::new("public", "outbox; DROP TABLE x").is_err());
        assert!(OutboxTable::new("a\"b", "t").is_err());
    }
}
