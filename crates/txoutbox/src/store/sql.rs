//! The SQL text of the stores: every statement of a database lives in a file of its own,
//! `store/<db>/sql/<what it does>.sql`, with `{{...}}` placeholders. Each store fills them
//! once, when it is built ([`Fill`]: the shared fragments first, then the validated names of
//! its [`crate::OutboxTable`] and its clock), and keeps the statements (its `Queries`).
//!
//! Some statements are finished per call, and only with text that is not input:
//! - `{{list}}` (MySQL): an `IN (...)` list whose length is the call's (`with_list`: `?`
//!   marks, or integers the database itself returned);
//! - `{{condition}}` (the operator's listings and dead-letter commands): a filter's
//!   condition, fixed column names and marks (`with_condition`, [`finish`]);
//! - the write path (`write.rs`) and the migrations (`schema.rs`), which have no store to
//!   keep statements in: they fill theirs from the table they are given.

/// The text of `store/<db>/sql/<name>.sql`.
macro_rules! sql_file {
    ($db:literal, $name:literal) => {
        include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/src/store/",
            $db,
            "/sql/",
            $name,
            ".sql"
        ))
    };
}
pub(crate) use sql_file;

/// An ordered claim takes events only while the relay's lease (of its partitions; on SQLite,
/// of the file) has at least this much left, so that it never overlaps another relay taking
/// over. `{{claim_margin_ms}}` in the statements.
pub(crate) const CLAIM_MARGIN_MS: u64 = 1000;

/// How a database's statement files are filled: fragments (which may hold names and other
/// fragments, in the order added) first, then names.
#[derive(Debug, Default)]
pub struct Fill {
    fragments: Vec<(&'static str, String)>,
    names: Vec<(&'static str, String)>,
}

impl Fill {
    /// `{{claim_margin_ms}}` and nothing else yet.
    pub(crate) fn new() -> Self {
        Self::default().name("{{claim_margin_ms}}", CLAIM_MARGIN_MS.to_string())
    }

    /// Replace `tag` with `value`: a validated name, or SQL that is fixed in this crate.
    pub(crate) fn name(mut self, tag: &'static str, value: impl Into<String>) -> Self {
        self.names.push((tag, value.into()));
        self
    }

    /// Replace `tag` with the statement text `sql` (its comment lines dropped).
    pub(crate) fn fragment(mut self, tag: &'static str, sql: &str) -> Self {
        self.fragments.push((tag, strip(sql)));
        self
    }

    /// `sql` filled.
    pub(crate) fn fill(&self, sql: &str) -> String {
        self.fill_with(sql, &[])
    }

    /// `sql` filled, with `extra` fragments of this statement alone replaced first.
    pub(crate) fn fill_with(&self, sql: &str, extra: &[(&str, &str)]) -> String {
        let mut out = strip(sql);
        for (tag, fragment) in extra {
            out = out.replace(tag, &strip(fragment));
        }
        for (tag, fragment) in &self.fragments {
            out = out.replace(tag, fragment);
        }
        for (tag, name) in &self.names {
            out = out.replace(tag, name);
        }
        out
    }
}

/// `sql` without its comment lines and trailing whitespace.
pub(crate) fn strip(sql: &str) -> String {
    let lines: Vec<&str> = sql
        .lines()
        .filter(|l| !l.trim_start().starts_with("--"))
        .collect();
    lines.join("\n").trim_end().to_string()
}

/// A statement finished per call: each tag replaced by its text (never input: SQL built in
/// this crate from fixed names and marks).
pub(crate) fn finish(sql: &str, tags: &[(&str, &str)]) -> String {
    let mut out = sql.to_string();
    for (tag, text) in tags {
        out = out.replace(tag, text);
    }
    out
}

/// A statement with its `{{list}}` replaced by `list` (`?` marks from [`marks`], or
/// integers from [`int_list`]).
#[cfg(feature = "mysql")]
pub(crate) fn with_list(sql: &str, list: &str) -> String {
    finish(sql, &[("{{list}}", list)])
}

/// An operator statement with its `{{condition}}` replaced by a filter's (fixed column names
/// and `?` marks: `EventFilter::to_sql`).
#[cfg(any(feature = "mysql", feature = "sqlite"))]
pub(crate) fn with_condition(sql: &str, condition: &str) -> String {
    finish(sql, &[("{{condition}}", condition)])
}

/// `?, ?, ?` for `n` values.
#[cfg(feature = "mysql")]
pub(crate) fn marks(n: usize) -> String {
    vec!["?"; n].join(", ")
}

/// `1,2,3`: integers (never input: partition numbers and `seq`s read from the database).
#[cfg(feature = "mysql")]
pub(crate) fn int_list<T: ToString>(v: impl IntoIterator<Item = T>) -> String {
    let items: Vec<String> = v.into_iter().map(|n| n.to_string()).collect();
    items.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every SQL file the project sends is ASCII: a server whose encoding is not UTF-8
    /// (LATIN1) refuses a statement with a character it cannot hold, even in a comment.
    #[test]
    fn every_sql_file_sent_is_ascii() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut dirs = vec![root.join("migrations"), root.join("src/store")];
        let mut checked = 0;
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(&dir).expect("a directory of the crate") {
                let path = entry.expect("an entry").path();
                if path.is_dir() {
                    dirs.push(path);
                } else if path.extension().is_some_and(|e| e == "sql") {
                    let text = std::fs::read(&path).expect("an SQL file");
                    let at = text.iter().position(|b| !b.is_ascii());
                    assert_eq!(at, None, "{} has a non-ASCII byte", path.display());
                    checked += 1;
                }
            }
        }
        assert!(checked > 50, "found the SQL files ({checked})");
    }

    #[test]
    fn fragments_then_names_comments_dropped() {
        let f = Fill::new()
            .fragment("{{cond}}", "-- a comment\nx < {{claim_margin_ms}}\n")
            .name("{{table}}", "\"t\"");
        let sql = "-- what it does\nSELECT 1 FROM {{table}}\nWHERE {{cond}} AND {{only}}\n";
        assert_eq!(
            f.fill_with(sql, &[("{{only}}", "y")]),
            "SELECT 1 FROM \"t\"\nWHERE x < 1000 AND y"
        );
        #[cfg(feature = "mysql")]
        assert_eq!(with_list("IN ({{list}})", &marks(2)), "IN (?, ?)");
    }
}
