//! The `pgoutput` logical decoding messages (protocol version 1, with `binary 'true'` and
//! `messages 'true'`) that the WAL source reads: Begin, Commit, Relation and Insert, and the
//! logical messages of `pg_logical_emit_message`. Updates, deletes, truncates, origins and
//! types are recognised and skipped (the outbox's publication publishes inserts only, but a
//! publication altered by hand must not stop the stream).
//!
//! The layout is PostgreSQL's "Logical Replication Message Formats"
//! (<https://www.postgresql.org/docs/15/protocol-logicalrep-message-formats.html>). Every
//! integer is big-endian; a string is NUL-terminated UTF-8. Column values of an Insert are in
//! the types' binary send format (`binary 'true'`), which depends on no `DateStyle` or
//! `TimeZone` setting.

use std::fmt;

use chrono::{DateTime, TimeDelta, Utc};

/// A position in the WAL (`pg_lsn`), as PostgreSQL prints it: `16/B374D848`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Lsn(pub u64);

impl fmt::Display for Lsn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:X}/{:X}", self.0 >> 32, self.0 & 0xFFFF_FFFF)
    }
}

impl std::str::FromStr for Lsn {
    type Err = DecodeError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || DecodeError(format!("{s:?} is not an LSN (like 16/B374D848)"));
        let (hi, lo) = s.split_once('/').ok_or_else(bad)?;
        let hi = u32::from_str_radix(hi, 16).map_err(|_| bad())?;
        let lo = u32::from_str_radix(lo, 16).map_err(|_| bad())?;
        Ok(Lsn((u64::from(hi) << 32) | u64::from(lo)))
    }
}

/// A message that does not follow the format: what is wrong, and where.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed pgoutput message: {0}")]
pub struct DecodeError(pub String);

/// A column of a relation, as its Relation message describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Column {
    /// The column's name.
    pub name: String,
    /// The OID of its type.
    pub type_oid: u32,
    /// Part of the replica identity (the key).
    pub key: bool,
}

/// A table, as its Relation message describes it: sent before the first change to it in a
/// session and again after its definition changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Relation {
    /// The relation's OID: later Insert messages name the table by it.
    pub oid: u32,
    /// Its schema.
    pub schema: String,
    /// Its name.
    pub name: String,
    /// Its columns, in the order of every tuple's values.
    pub columns: Vec<Column>,
}

/// One value of a tuple.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value<'a> {
    /// SQL NULL.
    Null,
    /// A TOASTed value that did not change (updates only; never in an insert).
    Unchanged,
    /// The value in its type's text format.
    Text(&'a [u8]),
    /// The value in its type's binary send format.
    Binary(&'a [u8]),
}

/// One decoded message.
#[derive(Debug, Clone, PartialEq)]
pub enum Message<'a> {
    /// A transaction begins; its changes follow, then its Commit.
    Begin {
        /// The LSN of its commit record.
        final_lsn: Lsn,
        /// When it committed.
        commit_time: DateTime<Utc>,
        /// Its transaction id.
        xid: u32,
    },
    /// The transaction ends.
    Commit {
        /// The LSN of its commit record.
        commit_lsn: Lsn,
        /// The LSN just past it: where a restart after this transaction begins, and the
        /// position to confirm once every one of its events is settled.
        end_lsn: Lsn,
        /// When it committed.
        commit_time: DateTime<Utc>,
    },
    /// A table's definition.
    Relation(Relation),
    /// A row inserted into the table of relation `oid`.
    Insert {
        /// The relation's OID.
        oid: u32,
        /// The row's values, in the relation's column order.
        values: Vec<Value<'a>>,
    },
    /// A `pg_logical_emit_message`.
    Message {
        /// Emitted in a transaction (delivered at its commit) or not (at once).
        transactional: bool,
        /// Where it is in the WAL.
        lsn: Lsn,
        /// Its prefix.
        prefix: String,
        /// Its content.
        content: &'a [u8],
    },
    /// A message of a kind the WAL source does not use (update, delete, truncate, origin,
    /// type): its tag.
    Skipped(u8),
}

/// Decode one message (the payload of one XLogData).
pub fn decode(data: &[u8]) -> Result<Message<'_>, DecodeError> {
    let mut r = Cursor { data, at: 0 };
    let tag = r.u8("the message tag")?;
    let msg = match tag {
        b'B' => Message::Begin {
            final_lsn: Lsn(r.u64("Begin's final LSN")?),
            commit_time: pg_time(r.i64("Begin's commit time")?)?,
            xid: r.u32("Begin's xid")?,
        },
        b'C' => {
            let _flags = r.u8("Commit's flags")?;
            Message::Commit {
                commit_lsn: Lsn(r.u64("Commit's LSN")?),
                end_lsn: Lsn(r.u64("Commit's end LSN")?),
                commit_time: pg_time(r.i64("Commit's time")?)?,
            }
        }
        b'R' => {
            let oid = r.u32("Relation's OID")?;
            let schema = r.string("Relation's schema")?;
            let name = r.string("Relation's name")?;
            let _replica_identity = r.u8("Relation's replica identity")?;
            let n = r.u16("Relation's column count")?;
            // A column takes 10 bytes at least: flags, an empty name's NUL, type, modifier.
            let mut columns = Vec::with_capacity(r.capacity(n, 10));
            for _ in 0..n {
                let flags = r.u8("a column's flags")?;
                let name = r.string("a column's name")?;
                let type_oid = r.u32("a column's type")?;
                let _typmod = r.u32("a column's type modifier")?;
                columns.push(Column {
                    name,
                    type_oid,
                    key: flags & 1 == 1,
                });
            }
            Message::Relation(Relation {
                oid,
                schema,
                name,
                columns,
            })
        }
        b'I' => {
            let oid = r.u32("Insert's relation")?;
            match r.u8("Insert's tuple marker")? {
                b'N' => {}
                other => {
                    return Err(DecodeError(format!(
                        "Insert's tuple marker is {:?}, not 'N'",
                        char::from(other)
                    )))
                }
            }
            Message::Insert {
                oid,
                values: r.tuple()?,
            }
        }
        b'M' => {
            let transactional = r.u8("Message's flags")? & 1 == 1;
            let lsn = Lsn(r.u64("Message's LSN")?);
            let prefix = r.string("Message's prefix")?;
            let len = r.len("Message's length")?;
            Message::Message {
                transactional,
                lsn,
                prefix,
                content: r.bytes(len, "Message's content")?,
            }
        }
        b'U' | b'D' | b'T' | b'O' | b'Y' => return Ok(Message::Skipped(tag)),
        other => {
            return Err(DecodeError(format!(
                "unknown message tag {:?} (0x{other:02x})",
                char::from(other)
            )))
        }
    };
    if r.at != data.len() {
        return Err(DecodeError(format!(
            "{} bytes left over after a {:?} message",
            data.len() - r.at,
            char::from(tag)
        )));
    }
    Ok(msg)
}

/// Microseconds since 2000-01-01 (PostgreSQL's epoch) as an instant.
pub(crate) fn pg_time(us: i64) -> Result<DateTime<Utc>, DecodeError> {
    DateTime::from_timestamp(946_684_800, 0)
        .and_then(|epoch| epoch.checked_add_signed(TimeDelta::microseconds(us)))
        .ok_or_else(|| DecodeError(format!("time {us} µs from 2000-01-01 is out of range")))
}

struct Cursor<'a> {
    data: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn bytes(&mut self, n: usize, what: &str) -> Result<&'a [u8], DecodeError> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.data.len());
        let Some(end) = end else {
            return Err(DecodeError(format!(
                "{what}: needs {n} bytes at offset {}, the message has {}",
                self.at,
                self.data.len()
            )));
        };
        let b = &self.data[self.at..end];
        self.at = end;
        Ok(b)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], DecodeError> {
        let b = self.bytes(N, what)?;
        let mut a = [0; N];
        a.copy_from_slice(b);
        Ok(a)
    }

    fn u8(&mut self, what: &str) -> Result<u8, DecodeError> {
        Ok(self.array::<1>(what)?[0])
    }

    fn u16(&mut self, what: &str) -> Result<u16, DecodeError> {
        Ok(u16::from_be_bytes(self.array(what)?))
    }

    fn u32(&mut self, what: &str) -> Result<u32, DecodeError> {
        Ok(u32::from_be_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &str) -> Result<u64, DecodeError> {
        Ok(u64::from_be_bytes(self.array(what)?))
    }

    fn i64(&mut self, what: &str) -> Result<i64, DecodeError> {
        Ok(i64::from_be_bytes(self.array(what)?))
    }

    /// An Int32 length, which must not be negative.
    fn len(&mut self, what: &str) -> Result<usize, DecodeError> {
        let n = i32::from_be_bytes(self.array(what)?);
        usize::try_from(n).map_err(|_| DecodeError(format!("{what} is negative ({n})")))
    }

    /// Room for `n` items the message claims, each of at least `least` bytes: no more than
    /// the bytes left can hold, so that a count read from a short message reserves nothing
    /// it cannot back (65 535 columns claimed by a message of a few bytes).
    fn capacity(&self, n: u16, least: usize) -> usize {
        usize::from(n).min((self.data.len() - self.at) / least.max(1))
    }

    fn string(&mut self, what: &str) -> Result<String, DecodeError> {
        let rest = &self.data[self.at..];
        let Some(nul) = rest.iter().position(|&b| b == 0) else {
            return Err(DecodeError(format!("{what}: no terminating NUL")));
        };
        let s = std::str::from_utf8(&rest[..nul])
            .map_err(|e| DecodeError(format!("{what} is not UTF-8: {e}")))?;
        self.at += nul + 1;
        Ok(s.to_string())
    }

    fn tuple(&mut self) -> Result<Vec<Value<'a>>, DecodeError> {
        let n = self.u16("the tuple's column count")?;
        // A value takes a byte at least: its kind.
        let mut values = Vec::with_capacity(self.capacity(n, 1));
        for i in 0..n {
            let value = match self.u8("a value's kind")? {
                b'n' => Value::Null,
                b'u' => Value::Unchanged,
                b't' => {
                    let len = self.len("a text value's length")?;
                    Value::Text(self.bytes(len, "a text value")?)
                }
                b'b' => {
                    let len = self.len("a binary value's length")?;
                    Value::Binary(self.bytes(len, "a binary value")?)
                }
                other => {
                    return Err(DecodeError(format!(
                        "value {i} has kind {:?}, not one of n, u, t, b",
                        char::from(other)
                    )))
                }
            };
            values.push(value);
        }
        Ok(values)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cstr(out: &mut Vec<u8>, s: &str) {
        out.extend_from_slice(s.as_bytes());
        out.push(0);
    }

    #[test]
    fn lsns_print_and_parse_as_postgresql_does() {
        let lsn: Lsn = "16/B374D848".parse().expect("an LSN");
        assert_eq!(lsn, Lsn(0x16_B374_D848));
        assert_eq!(lsn.to_string(), "16/B374D848");
        assert_eq!(Lsn(0).to_string(), "0/0");
        for bad in ["", "16", "16/", "x/1", "1/2/3", "100000000/0"] {
            assert!(bad.parse::<Lsn>().is_err(), "{bad:?} parsed");
        }
    }

    #[test]
    fn begin_relation_insert_and_commit_decode() {
        let mut b = vec![b'B'];
        b.extend_from_slice(&0x1_0000_0020u64.to_be_bytes());
        b.extend_from_slice(&1_000_000i64.to_be_bytes());
        b.extend_from_slice(&7u32.to_be_bytes());
        assert_eq!(
            decode(&b),
            Ok(Message::Begin {
                final_lsn: Lsn(0x1_0000_0020),
                commit_time: "2000-01-01T00:00:01Z".parse().expect("a time"),
                xid: 7,
            })
        );

        let mut r = vec![b'R'];
        r.extend_from_slice(&16384u32.to_be_bytes());
        cstr(&mut r, "public");
        cstr(&mut r, "outbox");
        r.push(b'd');
        r.extend_from_slice(&2u16.to_be_bytes());
        for (flags, name, oid) in [(1u8, "id", 2950u32), (0, "payload", 3802)] {
            r.push(flags);
            cstr(&mut r, name);
            r.extend_from_slice(&oid.to_be_bytes());
            r.extend_from_slice(&(-1i32).to_be_bytes());
        }
        let Ok(Message::Relation(rel)) = decode(&r) else {
            panic!("not a relation: {:?}", decode(&r));
        };
        assert_eq!(
            (rel.oid, rel.schema.as_str(), rel.name.as_str()),
            (16384, "public", "outbox")
        );
        assert_eq!(rel.columns.len(), 2);
        assert!(rel.columns[0].key && !rel.columns[1].key);
        assert_eq!(rel.columns[1].type_oid, 3802);

        let mut i = vec![b'I'];
        i.extend_from_slice(&16384u32.to_be_bytes());
        i.push(b'N');
        i.extend_from_slice(&3u16.to_be_bytes());
        i.push(b'b');
        i.extend_from_slice(&2i32.to_be_bytes());
        i.extend_from_slice(b"\x01{");
        i.push(b'n');
        i.push(b't');
        i.extend_from_slice(&1i32.to_be_bytes());
        i.push(b'x');
        assert_eq!(
            decode(&i),
            Ok(Message::Insert {
                oid: 16384,
                values: vec![Value::Binary(b"\x01{"), Value::Null, Value::Text(b"x")],
            })
        );

        let mut c = vec![b'C', 0];
        c.extend_from_slice(&0x20u64.to_be_bytes());
        c.extend_from_slice(&0x48u64.to_be_bytes());
        c.extend_from_slice(&0i64.to_be_bytes());
        assert!(matches!(
            decode(&c),
            Ok(Message::Commit {
                commit_lsn: Lsn(0x20),
                end_lsn: Lsn(0x48),
                ..
            })
        ));
    }

    #[test]
    fn truncated_padded_and_unknown_messages_are_errors_that_say_where() {
        let mut b = vec![b'B'];
        b.extend_from_slice(&[0; 19]);
        let err = decode(&b).expect_err("short");
        assert!(err.0.contains("Begin's xid"), "{err}");
        b.extend_from_slice(&[0; 2]);
        let err = decode(&b).expect_err("long");
        assert!(err.0.contains("1 bytes left over"), "{err}");
        assert!(decode(b"Z")
            .expect_err("unknown")
            .0
            .contains("unknown message tag 'Z'"));
        assert!(decode(b"").is_err());
        let mut i = vec![b'I'];
        i.extend_from_slice(&1u32.to_be_bytes());
        i.push(b'N');
        i.extend_from_slice(&1u16.to_be_bytes());
        i.push(b't');
        i.extend_from_slice(&(-5i32).to_be_bytes());
        assert!(decode(&i).expect_err("negative").0.contains("negative"));
        assert_eq!(decode(b"U\x00"), Ok(Message::Skipped(b'U')));
    }

    /// A column count read from the message reserves room for no more items than the rest
    /// of the message can hold: 65 535 claimed by a few bytes reserved 65 535 entries
    /// (3.6 MB for a Relation's columns) before the decoder found the message short.
    #[test]
    fn claimed_counts_reserve_only_what_the_message_can_hold() {
        let r = Cursor {
            data: &[0; 25],
            at: 5,
        };
        assert_eq!(r.capacity(u16::MAX, 10), 2);
        assert_eq!(r.capacity(u16::MAX, 1), 20);
        assert_eq!(r.capacity(3, 1), 3);
        let mut rel = vec![b'R', 0, 0, 0, 1, b's', 0, b't', 0, b'd'];
        rel.extend_from_slice(&u16::MAX.to_be_bytes());
        assert!(decode(&rel)
            .expect_err("short")
            .0
            .contains("column's flags"));
        let mut ins = vec![b'I', 0, 0, 0, 1, b'N'];
        ins.extend_from_slice(&u16::MAX.to_be_bytes());
        ins.push(b'n');
        assert!(decode(&ins).expect_err("short").0.contains("value's kind"));
    }
}
