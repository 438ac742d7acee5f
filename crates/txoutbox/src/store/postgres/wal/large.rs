//! A transaction too large to hold: past [`LARGE_TX_EVENTS`] outbox inserts the stream stops
//! keeping its events and keeps only their `seq`s, as ranges (a single `INSERT ... SELECT` is
//! one range, whatever its size). Once it commits, the relay hands its rows to the table path
//! by those ranges (`wal_hand_over.sql`), which publishes them in `seq` order per aggregate:
//! the relay's memory follows this bound and the batch size, never a transaction's size.
//!
//! Why hand over rather than stream in parts (`pgoutput` proto 2 streaming): the server
//! already spills a large transaction to disk while it decodes it (`logical_decoding_work_mem`),
//! so a second spill in the relay buys nothing; nothing of an uncommitted transaction may be
//! published anyway; and the table path exists, ordered and retried, for the events the stream
//! hands over when they fail.

/// Outbox inserts of one transaction the stream holds at most; past it the transaction goes
/// to the table path whole once committed (see the module's text).
pub const LARGE_TX_EVENTS: usize = 10_000;

/// At most this many ranges are kept; past it, neighbouring ranges are joined (a joined range
/// may cover rows of other transactions: the hand-over leaves those alone, see
/// `wal_hand_over.sql`).
const MAX_RANGES: usize = 4_096;

/// The `seq`s of a large transaction's outbox inserts, as inclusive ranges.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SeqRanges {
    ranges: Vec<(i64, i64)>,
    events: u64,
}

impl SeqRanges {
    /// Note one insert's `seq`.
    pub fn add(&mut self, seq: i64) {
        self.events += 1;
        if let Some(last) = self.ranges.last_mut() {
            if seq >= last.0 && seq <= last.1 {
                return;
            }
            if last.1.checked_add(1) == Some(seq) {
                last.1 = seq;
                return;
            }
        }
        self.ranges.push((seq, seq));
        if self.ranges.len() > MAX_RANGES {
            self.join();
        }
    }

    /// Halve the number of ranges: sort, then join each pair of neighbours.
    fn join(&mut self) {
        self.ranges.sort_unstable();
        self.ranges = self
            .ranges
            .chunks(2)
            .map(|p| (p[0].0, p[p.len() - 1].1.max(p[0].1)))
            .collect();
    }

    /// The ranges, inclusive at both ends.
    pub fn ranges(&self) -> &[(i64, i64)] {
        &self.ranges
    }

    /// How many inserts were noted.
    pub fn events(&self) -> u64 {
        self.events
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn consecutive_seqs_are_one_range_and_gaps_start_another() {
        let mut r = SeqRanges::default();
        for s in (1..=1000).chain(1005..=1010) {
            r.add(s);
        }
        assert_eq!(r.ranges(), &[(1, 1000), (1005, 1010)]);
        assert_eq!(r.events(), 1006);
    }

    #[test]
    fn past_the_limit_ranges_are_joined_and_still_cover_every_seq() {
        let mut r = SeqRanges::default();
        let seqs: Vec<i64> = (0..(MAX_RANGES as i64 * 3)).map(|i| i * 3).collect();
        for &s in &seqs {
            r.add(s);
        }
        assert!(r.ranges().len() <= MAX_RANGES);
        for s in seqs {
            assert!(
                r.ranges().iter().any(|&(lo, hi)| lo <= s && s <= hi),
                "{s} not covered"
            );
        }
    }
}
