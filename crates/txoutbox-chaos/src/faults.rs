//! Fault kinds and the seeded schedule that injects them, one at a time, at random moments.

use std::collections::BTreeMap;
use std::str::FromStr;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::Rng;

/// A kind of fault the run may inject.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    /// SIGKILL one or several relays, then start new ones.
    Kill,
    /// SIGSTOP a relay past its lease, then SIGCONT: a zombie.
    Stop,
    /// Reset live connections and refuse new ones for a while.
    Cut,
    /// Hold all traffic (a partition), connections stay open.
    Stall,
    /// Add latency to every chunk for a while.
    Slow,
    /// Reset live connections once, mid-stream.
    Reset,
    /// Crash and restart PostgreSQL.
    PgRestart,
    /// Restart the broker.
    BrokerRestart,
    /// Relays fail a fraction of publishes transiently (`--inject-faults`); continuous.
    Publisher,
    /// WAL source only: the replication slot goes away while the relays run (dropped, its
    /// reader's server process terminated first; or invalidated by `max_slot_wal_keep_size`).
    SlotLoss,
    /// The primary killed (an immediate stop) and its physical standby promoted; a new
    /// standby is then made of the old node in the background (`failover.rs`), and until it
    /// is ready this fault is postponed.
    Failover,
}

pub const ALL: &[Kind] = &[
    Kind::Kill,
    Kind::Stop,
    Kind::Cut,
    Kind::Stall,
    Kind::Slow,
    Kind::Reset,
    Kind::PgRestart,
    Kind::BrokerRestart,
    Kind::Publisher,
    Kind::SlotLoss,
    Kind::Failover,
];

/// The kinds that only a WAL run has.
fn wal_only(k: Kind) -> bool {
    k == Kind::SlotLoss
}

/// Is `k` in `all`? Slot loss in a WAL run only; every other kind in both. (Failover was
/// in a table run's only while the slot-loss fault could write WAL through a connection to
/// the old primary just turned standby; it now writes to the node it knows is primary.)
fn in_all(k: Kind, wal: bool) -> bool {
    wal || !wal_only(k)
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Kill => "kill",
            Kind::Stop => "stop",
            Kind::Cut => "cut",
            Kind::Stall => "stall",
            Kind::Slow => "slow",
            Kind::Reset => "reset",
            Kind::PgRestart => "pg-restart",
            Kind::BrokerRestart => "broker-restart",
            Kind::Publisher => "publisher",
            Kind::SlotLoss => "slot-loss",
            Kind::Failover => "failover",
        }
    }

    /// Network faults hit a proxy: PostgreSQL's or the broker's.
    pub fn is_network(self) -> bool {
        matches!(self, Kind::Cut | Kind::Stall | Kind::Slow | Kind::Reset)
    }
}

impl FromStr for Kind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        ALL.iter().copied().find(|k| k.name() == s).ok_or_else(|| {
            let names: Vec<&str> = ALL.iter().map(|k| k.name()).collect();
            format!("unknown fault {s:?} (known: {})", names.join(", "))
        })
    }
}

/// `kill,stop,...`, `all` or `none`; `wal`: the relays read the WAL (`slot-loss` is
/// allowed, and part of `all`, see [`in_all`]).
pub fn parse_list(s: &str, wal: bool) -> Result<Vec<Kind>, String> {
    match s.trim() {
        "all" => Ok(ALL.iter().copied().filter(|k| in_all(*k, wal)).collect()),
        "none" | "" => Ok(Vec::new()),
        list => {
            let mut kinds = list
                .split(',')
                .map(|k| k.trim().parse())
                .collect::<Result<Vec<Kind>, String>>()?;
            if let Some(k) = kinds.iter().find(|k| !wal && wal_only(**k)) {
                return Err(format!("{} needs --source wal", k.name()));
            }
            kinds.sort();
            kinds.dedup();
            Ok(kinds)
        }
    }
}

/// Where a network fault goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Link {
    Postgres,
    Broker,
}

/// One planned fault.
#[derive(Debug, Clone)]
pub struct Planned {
    pub kind: Kind,
    /// Which relays (indexes), for kill, stop and network faults.
    pub relays: Vec<usize>,
    pub link: Link,
    /// How long a cut, stall or slow lasts.
    pub hold: Duration,
    /// Latency of a slow link.
    pub latency: Duration,
    /// Slot loss by invalidation (`max_slot_wal_keep_size`) rather than by dropping the slot.
    pub invalidate: bool,
}

/// Draws the faults: kinds come out of a shuffled bag (refilled when empty), so a short run
/// still meets every kind; targets, links and durations are drawn at random. All from the
/// seeded generator: the same seed gives the same schedule.
pub struct Schedule {
    kinds: Vec<Kind>,
    bag: Vec<Kind>,
    /// How often a failover was drawn while the standby was not ready, and put off.
    pub postponed: u32,
}

impl Schedule {
    /// `kinds`: the enabled ones (`publisher` is continuous, not scheduled).
    pub fn new(kinds: &[Kind]) -> Self {
        Self {
            kinds: kinds
                .iter()
                .copied()
                .filter(|k| *k != Kind::Publisher)
                .collect(),
            bag: Vec::new(),
            postponed: 0,
        }
    }

    /// The next fault. `failover_ready`: a standby can take over now; when it cannot, a
    /// failover drawn goes back to the bottom of the bag (drawn again after the others) and
    /// another kind is drawn instead (`None` if it was the only one).
    pub fn next(
        &mut self,
        rng: &mut StdRng,
        relays: usize,
        failover_ready: bool,
    ) -> Option<Planned> {
        if self.bag.is_empty() {
            self.bag = self.kinds.clone();
            self.bag.shuffle(rng);
        }
        let mut kind = self.bag.pop()?;
        if kind == Kind::Failover && !failover_ready {
            self.postponed += 1;
            if self.bag.is_empty() {
                // A round of the other kinds comes first.
                self.bag = self
                    .kinds
                    .iter()
                    .copied()
                    .filter(|k| *k != Kind::Failover)
                    .collect();
                self.bag.shuffle(rng);
            }
            self.bag.insert(0, kind);
            if self.bag.len() == 1 {
                return None;
            }
            kind = self.bag.pop()?;
        }
        let mut all: Vec<usize> = (0..relays).collect();
        all.shuffle(rng);
        let how_many = match kind {
            // Several relays at once, now and then.
            Kind::Kill if rng.gen_bool(0.3) => rng.gen_range(1..=relays),
            k if k.is_network() && rng.gen_bool(0.3) => relays,
            _ => 1,
        };
        all.truncate(how_many.max(1));
        // Drawn for slot loss only, so that the other kinds' schedules stay as they were.
        let invalidate = kind == Kind::SlotLoss && rng.gen_bool(0.5);
        Some(Planned {
            kind,
            relays: all,
            link: if rng.gen_bool(0.5) {
                Link::Postgres
            } else {
                Link::Broker
            },
            hold: Duration::from_millis(rng.gen_range(1_000..6_000)),
            latency: Duration::from_millis(rng.gen_range(20..300)),
            invalidate,
        })
    }
}

/// How many faults of each kind (network ones per link) were injected.
#[derive(Debug, Default)]
pub struct Tally {
    pub counts: BTreeMap<String, u64>,
}

impl Tally {
    pub fn add(&mut self, p: &Planned) {
        let key = if p.kind.is_network() {
            let link = match p.link {
                Link::Postgres => "pg",
                Link::Broker => "broker",
            };
            format!("{}-{link}", p.kind.name())
        } else if p.kind == Kind::SlotLoss {
            let how = if p.invalidate { "invalidate" } else { "drop" };
            format!("{}-{how}", p.kind.name())
        } else {
            p.kind.name().to_string()
        };
        *self.counts.entry(key).or_default() += 1;
    }

    pub fn total(&self) -> u64 {
        self.counts.values().sum()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn the_schedule_is_reproducible_from_the_seed_and_meets_every_kind_early() {
        let draw = |seed| {
            let mut rng = StdRng::seed_from_u64(seed);
            let mut s = Schedule::new(ALL);
            (0..50)
                .map(|_| {
                    let p = s.next(&mut rng, 3, true).unwrap();
                    (p.kind, p.relays, p.link, p.hold)
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(draw(7), draw(7));
        assert_ne!(draw(7), draw(8));
        // The first ten faults are the ten discrete kinds.
        let first: std::collections::BTreeSet<Kind> = draw(7)
            .into_iter()
            .take(ALL.len() - 1)
            .map(|d| d.0)
            .collect();
        assert_eq!(first.len(), ALL.len() - 1);
    }

    #[test]
    fn fault_lists_parse() {
        assert_eq!(
            parse_list("kill,stop", false).unwrap(),
            vec![Kind::Kill, Kind::Stop]
        );
        // Slot loss is a WAL run's fault only: in its `all`, refused by name without it.
        // Failover is in both `all`s.
        let wal = parse_list("all", true).unwrap();
        assert_eq!(wal.len(), ALL.len());
        assert!(wal.contains(&Kind::SlotLoss) && wal.contains(&Kind::Failover));
        assert_eq!(
            parse_list("failover,kill", true).unwrap(),
            vec![Kind::Kill, Kind::Failover]
        );
        let table = parse_list("all", false).unwrap();
        assert_eq!(table.len(), ALL.len() - 1);
        assert!(!table.contains(&Kind::SlotLoss));
        assert_eq!(
            parse_list("slot-loss,kill", true).unwrap(),
            vec![Kind::Kill, Kind::SlotLoss]
        );
        assert!(parse_list("slot-loss", false)
            .unwrap_err()
            .contains("--source wal"));
        assert!(parse_list("none", false).unwrap().is_empty());
        assert!(parse_list("kill,boom", false).unwrap_err().contains("boom"));
        let mut only_publisher = Schedule::new(&[Kind::Publisher]);
        assert!(only_publisher
            .next(&mut StdRng::seed_from_u64(1), 3, true)
            .is_none());
        // Failover is in a table run's `all`.
        assert!(table.contains(&Kind::Failover));
    }

    #[test]
    fn a_failover_is_not_drawn_while_the_standby_is_not_ready_but_comes_once_it_is() {
        let mut rng = StdRng::seed_from_u64(3);
        let mut s = Schedule::new(&[Kind::Kill, Kind::Stop, Kind::Failover]);
        let kinds: Vec<Kind> = (0..30)
            .map(|_| s.next(&mut rng, 3, false).unwrap().kind)
            .collect();
        assert!(!kinds.contains(&Kind::Failover), "{kinds:?}");
        assert!(kinds.contains(&Kind::Kill) && kinds.contains(&Kind::Stop));
        assert!(s.postponed >= 10, "postponed {}", s.postponed);
        // Postponed, not dropped: it is among the next draws once the standby is ready.
        let postponed = s.postponed;
        let next: Vec<Kind> = (0..3)
            .map(|_| s.next(&mut rng, 3, true).unwrap().kind)
            .collect();
        assert!(next.contains(&Kind::Failover), "{next:?}");
        assert_eq!(s.postponed, postponed);
        // The only kind, and not ready: nothing to inject now.
        let mut only = Schedule::new(&[Kind::Failover]);
        assert!(only.next(&mut rng, 3, false).is_none());
        assert_eq!(only.next(&mut rng, 3, true).unwrap().kind, Kind::Failover);
    }
}
