//! Property tests of the WAL source's decoders over bytes a server (or whatever answers in its
//! place) may send: the `pgoutput` messages ([`pgoutput::decode`]), an outbox row's column
//! values ([`Layout::read`]), whole message sequences ([`Transactions::feed`]) and LSNs. Each
//! takes arbitrary bytes, and valid messages from small generators with a few mutations (a
//! byte flipped, the message cut short or lengthened, a length or count made to claim a huge
//! size), which reach deeper than random bytes do. What must hold: every decoder returns `Ok`
//! or `Err`, never panics, and reserves no more than the input can back. The last is checked
//! on what a decoder returns and on huge claims failing at once; what a failing decode
//! reserved is not seen by a test (no counting allocator: the crate forbids `unsafe`), so
//! the code was read for it: the one reservation sized by a count from the input
//! (`pgoutput`'s columns and values) is bounded by the bytes left. The stream's framing has
//! its own properties, in `stream::props`.
//!
//! 256 cases a property by default (a few seconds); `PROPTEST_CASES` sets more, and
//! `scripts/fuzz-decoders.sh` runs them for hours, a fresh seed each round.

use std::time::{Duration, Instant};

use proptest::collection::vec;
use proptest::prelude::*;
use proptest::sample::{select, Index};

use super::large::LARGE_TX_EVENTS;
use super::pgoutput::{decode, Column, Lsn, Message, Relation, Value};
use super::row::{Layout, COLUMNS};
use super::{tableless, Transactions};
use crate::OutboxTable;

/// A change made to a valid message.
#[derive(Debug, Clone)]
pub(crate) enum Mutation {
    /// A byte xor-ed with a non-zero value.
    Flip(Index, u8),
    /// Cut short there.
    Truncate(Index),
    /// Bytes inserted there.
    Insert(Index, Vec<u8>),
    /// Four bytes overwritten by a huge size (a length or count that claims too much).
    Claim(Index, u32),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let huge = select(vec![
        0xFFFF_FFFF,
        0x7FFF_FFFF,
        0x8000_0000,
        0x4000_0000,
        0x4010_0001,
        0x0000_FFFF,
        0xFFFF_0000,
        0x0001_0000,
    ]);
    prop_oneof![
        (any::<Index>(), 1..=255u8).prop_map(|(i, x)| Mutation::Flip(i, x)),
        any::<Index>().prop_map(Mutation::Truncate),
        (any::<Index>(), vec(any::<u8>(), 1..8)).prop_map(|(i, b)| Mutation::Insert(i, b)),
        (any::<Index>(), huge).prop_map(|(i, v)| Mutation::Claim(i, v)),
    ]
}

fn apply(mut b: Vec<u8>, m: &Mutation) -> Vec<u8> {
    match m {
        Mutation::Flip(i, x) if !b.is_empty() => {
            let at = i.index(b.len());
            b[at] ^= x;
        }
        Mutation::Truncate(i) => b.truncate(i.index(b.len() + 1)),
        Mutation::Insert(i, extra) => {
            let at = i.index(b.len() + 1);
            b.splice(at..at, extra.iter().copied());
        }
        Mutation::Claim(i, v) if !b.is_empty() => {
            let at = i.index(b.len());
            for (k, byte) in v.to_be_bytes().into_iter().enumerate() {
                if let Some(x) = b.get_mut(at + k) {
                    *x = byte;
                }
            }
        }
        _ => {}
    }
    b
}

/// `valid`'s messages with up to three mutations each (none, a quarter of the time).
pub(crate) fn mutated(valid: impl Strategy<Value = Vec<u8>>) -> impl Strategy<Value = Vec<u8>> {
    (valid, vec(mutation(), 0..=3)).prop_map(|(b, ms)| ms.iter().fold(b, apply))
}

pub(crate) fn cstr(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(s.as_bytes());
    out.push(0);
}

/// Up to `max` characters, any but NUL. (Not a regex strategy such as `"\\PC{0,12}"`: the
/// generators are made anew for every case, and building a regex's Unicode class took most
/// of a case's time.)
pub(crate) fn text(max: usize) -> impl Strategy<Value = String> {
    vec(any::<char>(), 0..=max).prop_map(|cs| cs.into_iter().filter(|&c| c != '\0').collect())
}

/// A name without NUL: an outbox column's, a plain one, or any text.
fn name() -> impl Strategy<Value = String> {
    let names: Vec<String> = COLUMNS.iter().map(|(n, _)| n.to_string()).collect();
    let plain = vec(select(b"abcdefghijklmnopqrstuvwxyz_".to_vec()), 0..=12)
        .prop_map(|b| b.into_iter().map(char::from).collect());
    prop_oneof![select(names), plain, text(6)]
}

/// A column of a relation: mostly one of the outbox's with its type.
fn column() -> impl Strategy<Value = (String, u32)> {
    let oids: Vec<u32> = COLUMNS.iter().map(|&(_, oid)| oid).collect();
    prop_oneof![
        4 => select(COLUMNS.to_vec()).prop_map(|(n, oid)| (n.to_owned(), oid)),
        1 => (name(), prop_oneof![select(oids), any::<u32>()]),
    ]
}

/// Microseconds from 2000-01-01 that PostgreSQL and chrono both hold.
fn pg_micros() -> impl Strategy<Value = i64> {
    prop_oneof![-10i64.pow(16)..10i64.pow(16), Just(0)]
}

fn json() -> impl Strategy<Value = String> {
    prop_oneof![
        select(vec![
            "{}",
            "{\"k\":\"v\",\"n\":1}",
            "[1,2]",
            "null",
            "\"s\"",
            "1e400"
        ])
        .prop_map(str::to_owned),
        text(10),
        // Deeper than serde_json's recursion limit (128): an error, not a stack overflow.
        (0..300usize).prop_map(|d| format!("{}{}", "[".repeat(d), "]".repeat(d))),
    ]
}

/// A value in the binary send format of the type `oid` (uuid, int8, timestamptz, int4, text,
/// jsonb; bytes for any other).
fn value_of(oid: u32) -> BoxedStrategy<Vec<u8>> {
    let be8 = |v: i64| v.to_be_bytes().to_vec();
    match oid {
        2950 => any::<[u8; 16]>().prop_map(|b| b.to_vec()).boxed(),
        20 => any::<i64>().prop_map(be8).boxed(),
        1184 => prop_oneof![pg_micros(), Just(i64::MAX), Just(i64::MIN), any::<i64>()]
            .prop_map(be8)
            .boxed(),
        23 => any::<i32>().prop_map(|v| v.to_be_bytes().to_vec()).boxed(),
        25 => text(12).prop_map(String::into_bytes).boxed(),
        3802 => (prop_oneof![8 => Just(1u8), 1 => any::<u8>()], json())
            .prop_map(|(v, j)| [&[v][..], j.as_bytes()].concat())
            .boxed(),
        _ => vec(any::<u8>(), 0..16).boxed(),
    }
}

/// A tuple's entry for a column of type `oid`: its kind, then its length and bytes.
fn entry(oid: u32) -> impl Strategy<Value = Vec<u8>> {
    let with = |kind: u8| {
        move |v: Vec<u8>| {
            let mut e = vec![kind];
            e.extend_from_slice(&(v.len() as i32).to_be_bytes());
            e.extend_from_slice(&v);
            e
        }
    };
    prop_oneof![
        8 => value_of(oid).prop_map(with(b'b')),
        1 => value_of(oid).prop_map(with(b't')),
        1 => Just(vec![b'n']),
        1 => Just(vec![b'u']),
    ]
}

fn begin(lsn: u64, time: i64, xid: u32) -> Vec<u8> {
    let mut b = vec![b'B'];
    b.extend_from_slice(&lsn.to_be_bytes());
    b.extend_from_slice(&time.to_be_bytes());
    b.extend_from_slice(&xid.to_be_bytes());
    b
}

fn commit(lsn: u64, end: u64, time: i64) -> Vec<u8> {
    let mut b = vec![b'C', 0];
    b.extend_from_slice(&lsn.to_be_bytes());
    b.extend_from_slice(&end.to_be_bytes());
    b.extend_from_slice(&time.to_be_bytes());
    b
}

fn relation(oid: u32, schema: &str, table: &str, cols: &[(String, u32)]) -> Vec<u8> {
    let mut b = vec![b'R'];
    b.extend_from_slice(&oid.to_be_bytes());
    cstr(&mut b, schema);
    cstr(&mut b, table);
    b.push(b'd');
    b.extend_from_slice(&(cols.len() as u16).to_be_bytes());
    for (i, (name, type_oid)) in cols.iter().enumerate() {
        b.push(u8::from(i == 0));
        cstr(&mut b, name);
        b.extend_from_slice(&type_oid.to_be_bytes());
        b.extend_from_slice(&(-1i32).to_be_bytes());
    }
    b
}

fn insert(oid: u32, entries: &[Vec<u8>]) -> Vec<u8> {
    let mut b = vec![b'I'];
    b.extend_from_slice(&oid.to_be_bytes());
    b.push(b'N');
    b.extend_from_slice(&(entries.len() as u16).to_be_bytes());
    for e in entries {
        b.extend_from_slice(e);
    }
    b
}

fn logical(flags: u8, lsn: u64, prefix: &str, content: &[u8]) -> Vec<u8> {
    let mut b = vec![b'M', flags];
    b.extend_from_slice(&lsn.to_be_bytes());
    cstr(&mut b, prefix);
    b.extend_from_slice(&(content.len() as i32).to_be_bytes());
    b.extend_from_slice(content);
    b
}

/// A tuple's entries for the columns `cols`.
fn entries(cols: &[(String, u32)]) -> impl Strategy<Value = Vec<Vec<u8>>> {
    cols.iter().map(|&(_, oid)| entry(oid)).collect::<Vec<_>>()
}

/// One valid message of each kind the decoder reads (and a skipped one).
fn message() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        (any::<u64>(), pg_micros(), any::<u32>()).prop_map(|(l, t, x)| begin(l, t, x)),
        (any::<u64>(), any::<u64>(), pg_micros()).prop_map(|(l, e, t)| commit(l, e, t)),
        (any::<u32>(), name(), name(), vec(column(), 0..24))
            .prop_map(|(oid, s, t, c)| relation(oid, &s, &t, &c)),
        (
            any::<u32>(),
            vec(column(), 0..24).prop_flat_map(|c| entries(&c))
        )
            .prop_map(|(oid, e)| insert(oid, &e)),
        (any::<u8>(), any::<u64>(), name(), vec(any::<u8>(), 0..32))
            .prop_map(|(f, l, p, c)| logical(f, l, &p, &c)),
        (select(b"UDTOY".to_vec()), vec(any::<u8>(), 0..16)).prop_map(|(t, rest)| [
            &[t][..],
            &rest
        ]
        .concat()),
    ]
}

/// Decode `b`; what it decoded holds no more than `b` backs.
fn decode_checked(b: &[u8]) -> Result<(), TestCaseError> {
    match decode(b) {
        Ok(Message::Relation(rel)) => {
            prop_assert!(
                rel.columns.capacity() <= b.len() / 10,
                "{}",
                rel.columns.capacity()
            );
        }
        Ok(Message::Insert { values, .. }) => {
            prop_assert!(values.capacity() <= b.len(), "{}", values.capacity());
        }
        _ => {}
    }
    Ok(())
}

fn outbox() -> OutboxTable {
    OutboxTable::new("public", "outbox_events").expect("a table")
}

/// One step of a message sequence for [`Transactions`].
#[derive(Debug, Clone)]
enum Step {
    Begin(u32),
    Commit(u64),
    /// An insert into the outbox (its row's entries), or into relation 2 (another table).
    Insert(u32, Vec<Vec<u8>>),
    /// The outbox's Relation message again, or one of another table.
    Relation(bool),
    Message(Vec<u8>),
    /// A logical message of the outbox's prefix (a tableless event): its content, valid,
    /// mutated or arbitrary, and whether it is transactional.
    Tableless(Vec<u8>, bool),
    /// A message of any kind, mutated.
    Other(Vec<u8>),
}

/// A sequence for [`Transactions`]: the outbox's relation (oid 1) with columns `cols`, then
/// steps in any order (Begin inside a transaction, Commit without one included).
fn sequence() -> impl Strategy<Value = (Vec<(String, u32)>, Vec<Step>)> {
    let outbox_cols = prop_oneof![
        Just(
            COLUMNS
                .iter()
                .map(|&(n, o)| (n.to_owned(), o))
                .collect::<Vec<_>>()
        ),
        vec(column(), 0..24),
    ];
    outbox_cols.prop_flat_map(|cols| {
        let row = entries(&cols);
        let step = prop_oneof![
            2 => any::<u32>().prop_map(Step::Begin),
            2 => any::<u64>().prop_map(Step::Commit),
            6 => (prop_oneof![4 => Just(1u32), 1 => Just(2u32), 1 => 1..4u32], row)
                .prop_map(|(oid, e)| Step::Insert(oid, e)),
            1 => any::<bool>().prop_map(Step::Relation),
            1 => vec(any::<u8>(), 0..8).prop_map(Step::Message),
            2 => (tableless_content(), prop_oneof![4 => Just(true), 1 => Just(false)])
                .prop_map(|(c, t)| Step::Tableless(c, t)),
            1 => mutated(message()).prop_map(Step::Other),
        ];
        (Just(cols), vec(step, 0..40))
    })
}

/// A tableless event's content: valid (from a generated event), mutated, or arbitrary.
fn tableless_content() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        2 => valid_tableless(),
        2 => mutated(valid_tableless()),
        1 => vec(any::<u8>(), 0..64),
    ]
}

/// A valid tableless event's content.
fn valid_tableless() -> impl Strategy<Value = Vec<u8>> {
    (
        text(12),
        text(12),
        text(12),
        json(),
        proptest::option::of(vec(any::<u8>(), 0..16)),
        pg_micros(),
    )
        .prop_map(|(at, ai, et, payload, bytes, us)| {
            tableless::encode(&tableless_event(at, ai, et, payload, bytes, us))
        })
}

/// An event with these fields, as a tableless message carries it.
fn tableless_event(
    aggregate_type: String,
    aggregate_id: String,
    event_type: String,
    payload: String,
    bytes: Option<Vec<u8>>,
    created_us: i64,
) -> crate::OutboxEvent {
    let created = super::pgoutput::pg_time(created_us).unwrap_or_default();
    let mut e = tableless::decode(&[], Lsn(0), created).event;
    e.id = uuid::Uuid::from_u128((created_us as u128).wrapping_mul(7).wrapping_add(1));
    e.aggregate_type = aggregate_type;
    e.aggregate_id = aggregate_id;
    e.event_type = event_type;
    e.created_at = created;
    e.available_at = created;
    match bytes {
        Some(b) => {
            e.payload_bytes = Some(b);
            e.content_type = Some("application/octet-stream".into());
        }
        None => {
            e.payload = crate::JsonPayload::from_text(&payload).unwrap_or_default();
        }
    }
    e.headers.insert("k".into(), "v".into());
    e
}

proptest! {
    /// Any content of the outbox's prefix decodes to an event or to its problems, never a
    /// panic; a valid one comes back as written.
    #[test]
    fn tableless_content_decodes_or_says_why(c in tableless_content()) {
        let e = tableless::decode(&c, Lsn(5), chrono::Utc::now());
        prop_assert!(e.tableless);
        prop_assert!(e.problems.is_empty() || !e.problems[0].is_empty());
    }

    #[test]
    fn valid_tableless_content_comes_back_as_written(
        at in text(12), ai in text(12), et in text(12), payload in json(),
        bytes in proptest::option::of(vec(any::<u8>(), 0..32)), us in pg_micros(),
    ) {
        let want = tableless_event(at, ai, et, payload, bytes, us);
        let got = tableless::decode(&tableless::encode(&want), Lsn(5), chrono::Utc::now());
        prop_assert!(got.problems.is_empty(), "{:?}", got.problems);
        prop_assert_eq!(got.event, want);
    }

    #[test]
    fn decode_takes_arbitrary_bytes(b in vec(any::<u8>(), 0..512)) {
        decode_checked(&b)?;
    }

    /// Past the tag check at once: a known tag, then arbitrary bytes.
    #[test]
    fn decode_takes_arbitrary_bytes_after_a_tag(
        tag in select(b"BCRIMUDTOY".to_vec()),
        rest in vec(any::<u8>(), 0..512),
    ) {
        decode_checked(&[&[tag][..], &rest].concat())?;
    }

    #[test]
    fn decode_takes_mutated_messages(b in mutated(message())) {
        decode_checked(&b)?;
    }

    /// The generator makes valid messages: the mutations start from the decoder's depths.
    #[test]
    fn valid_messages_decode(b in message()) {
        prop_assert!(decode(&b).is_ok(), "{:?}", decode(&b));
    }

    /// A length or count that claims more than the message holds is an error, found at
    /// once: nothing is reserved or read for what is not there.
    #[test]
    fn huge_claims_are_errors_found_at_once(
        claim in prop_oneof![
            any::<i32>(),
            Just(i32::MAX),
            Just(i32::MIN),
            Just(0x4000_0000),
        ],
        count in 1u16..=u16::MAX,
        content in vec(any::<u8>(), 0..64),
    ) {
        let started = Instant::now();
        let mut m = logical(1, 0, "p", &content);
        let at = m.len() - content.len() - 4;
        m[at..at + 4].copy_from_slice(&claim.to_be_bytes());
        let fits = usize::try_from(claim).is_ok_and(|n| n == content.len());
        prop_assert_eq!(decode(&m).is_ok(), fits);
        for kind in [b't', b'b'] {
            let mut e = vec![kind];
            e.extend_from_slice(&claim.to_be_bytes());
            e.extend_from_slice(&content);
            prop_assert_eq!(decode(&insert(1, &[e])).is_ok(), fits);
        }
        // Each column or value a byte short of what the count claims.
        let mut rel = relation(1, "s", "t", &[]);
        let at = rel.len() - 2;
        rel[at..].copy_from_slice(&count.to_be_bytes());
        rel.extend(std::iter::repeat_n(0, 10 * usize::from(count) - 1).take(content.len()));
        prop_assert!(decode(&rel).is_err());
        let mut ins = insert(1, &[]);
        let at = ins.len() - 2;
        ins[at..].copy_from_slice(&count.to_be_bytes());
        ins.extend(std::iter::repeat_n(b'n', usize::from(count) - 1).take(content.len()));
        prop_assert!(decode(&ins).is_err());
        prop_assert!(started.elapsed() < Duration::from_secs(2), "{:?}", started.elapsed());
    }

    #[test]
    fn lsns_parse_any_text_and_print_any_position(s in "\\PC{0,24}", lsn in any::<u64>()) {
        let _ = s.parse::<Lsn>();
        prop_assert_eq!(Lsn(lsn).to_string().parse::<Lsn>(), Ok(Lsn(lsn)));
    }

    /// Any relation, any values: `Err` exactly when the widths differ; a problem per column
    /// that does not decode, never a panic.
    #[test]
    fn rows_take_any_values(
        cols in vec(column(), 0..24),
        raw in vec((0..4u8, vec(any::<u8>(), 0..24)), 0..24),
    ) {
        let rel = Relation {
            oid: 1,
            schema: "public".into(),
            name: "outbox_events".into(),
            columns: cols
                .into_iter()
                .map(|(name, type_oid)| Column { name, type_oid, key: false })
                .collect(),
        };
        let values: Vec<Value<'_>> = raw
            .iter()
            .map(|(kind, b)| match kind {
                0 => Value::Null,
                1 => Value::Unchanged,
                2 => Value::Text(b),
                _ => Value::Binary(b),
            })
            .collect();
        let read = Layout::of(&rel).read(&values);
        prop_assert_eq!(read.is_ok(), values.len() == rel.columns.len());
    }

    /// Message sequences in any order, with mutated messages among them: `Transactions`
    /// answers each with `Ok` or `Err` and keeps its bounds: at most `bound` events a
    /// transaction, none once it is large, and a position that never goes back.
    #[test]
    fn transactions_take_any_sequence(
        (cols, steps) in sequence(),
        bound in prop_oneof![1..8usize, Just(LARGE_TX_EVENTS)],
        byte_bound in prop_oneof![1..256u64, Just(u64::MAX)],
    ) {
        let mut asm = Transactions::new(outbox()).with_bound(bound).with_byte_bound(byte_bound);
        let mut fed = vec![relation(1, "public", "outbox_events", &cols)];
        let mut lsn = 0u64;
        for step in steps {
            fed.push(match step {
                Step::Begin(xid) => begin(lsn, 0, xid),
                Step::Commit(d) => {
                    let end = lsn.saturating_add(d % 4096);
                    lsn = end;
                    commit(lsn, end, 0)
                }
                Step::Insert(oid, e) => insert(oid, &e),
                Step::Relation(true) => relation(1, "public", "outbox_events", &cols),
                Step::Relation(false) => relation(2, "public", "other", &cols),
                Step::Message(c) => logical(1, lsn, "p", &c),
                Step::Tableless(c, t) => {
                    logical(u8::from(t), lsn, &outbox().tableless_prefix(), &c)
                }
                Step::Other(m) => m,
            });
        }
        let mut position = Lsn(0);
        for m in &fed {
            if let Ok(Some(tx)) = asm.feed(m) {
                // Rows are bounded; tableless events have no row to come back to and are
                // kept (a large transaction keeps only those).
                let rows = tx.events.iter().filter(|e| !e.tableless).count();
                prop_assert!(rows <= bound);
                prop_assert!(tx.large.is_none() || rows == 0);
                for e in tx.events.iter().filter(|e| e.tableless) {
                    prop_assert_eq!(e.event.seq, 0);
                }
            }
            prop_assert!(asm.position() >= position);
            position = asm.position();
        }
    }

    /// Well-formed transactions of outbox rows come out whole: every insert an event (what
    /// did not decode noted in it), or, past the bound, a large transaction that counted
    /// every one.
    #[test]
    fn whole_transactions_come_out_whole(
        rows in vec(entries(&COLUMNS.map(|(n, o)| (n.to_owned(), o))), 0..12),
        bound in 1..8usize,
    ) {
        let cols: Vec<(String, u32)> = COLUMNS.iter().map(|&(n, o)| (n.to_owned(), o)).collect();
        let mut asm = Transactions::new(outbox()).with_bound(bound);
        prop_assert!(asm.feed(&relation(1, "public", "outbox_events", &cols))?.is_none());
        prop_assert!(asm.feed(&begin(16, 0, 7))?.is_none());
        for row in &rows {
            prop_assert!(asm.feed(&insert(1, row))?.is_none());
        }
        let tx = asm.feed(&commit(16, 40, 0))?;
        prop_assert_eq!(asm.position(), Lsn(40));
        match tx {
            None => prop_assert!(rows.is_empty()),
            Some(tx) if rows.len() > bound => {
                prop_assert!(tx.events.is_empty());
                prop_assert_eq!(tx.large.map(|l| l.events()), Some(rows.len() as u64));
            }
            Some(tx) => prop_assert_eq!(tx.events.len(), rows.len()),
        }
    }
}
