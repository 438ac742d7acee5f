//! Sharing the partitions of the aggregate-hash space among relays, with the database as the
//! coordinator: one row per partition with an owner and a lease, one row per relay with a
//! heartbeat. Every heartbeat renews what a relay owns and moves it towards a fair share
//! (`ceil(partitions / live relays)`): over its share it gives partitions up, under it it takes
//! free or expired ones. A partition has one owner column, so it is never owned twice; one
//! whose owner died is free again once its lease runs out.
//!
//! [`rebalance`] is that algorithm, once, over the steps of a [`Coordinator`] (one
//! transaction). [`InTransaction`] is the coordinator of every database: it runs the
//! statements that differ only in their SQL ([`HeartbeatSql`], from each database's
//! `sql/partitions_*.sql`) itself, and leaves those whose parameters or steps differ
//! ([`OwnSql`]: PostgreSQL bumps an epoch and returns rows, MySQL locks and then updates) to
//! the database's own module.

use std::future::Future;
use std::sync::OnceLock;
use std::time::Duration;

use sqlx::{
    ColumnIndex, Database, Decode, Encode, Executor, IntoArguments, Row, Transaction, Type,
};

use crate::error::{db_error, Error};
use crate::store::{Membership, RebalanceParams};
use crate::OutboxTable;

/// The relay a heartbeat is for.
#[derive(Debug, Clone)]
pub(crate) struct Me<'a> {
    pub relay_id: &'a str,
    /// Its mode's name ([`crate::store::Ordering::mode_name`]); a WAL relay's is
    /// [`WAL_MODE`] and its slot.
    pub mode: &'a str,
    /// This process's instance id, as text.
    pub instance: String,
    /// How long its registration and partitions last without a heartbeat.
    pub lease: Duration,
}

/// One heartbeat's transaction on one database, for relay `me`. Every method runs in that
/// transaction.
pub(crate) trait Coordinator {
    /// Take the table's registration lock, held until commit: one heartbeat at a time per
    /// table. Two relays registering at once would otherwise each miss the other's
    /// uncommitted row and both pass the checks of [`rebalance`] (an ordered and an unordered
    /// relay on one table, or two processes with one relay id).
    async fn lock(&mut self) -> Result<(), Error>;
    /// Seconds left on the relay id if another live process (another instance) holds it.
    async fn held_elsewhere(&mut self, me: &Me<'_>) -> Result<Option<f64>, Error>;
    /// Insert or refresh this relay's row: alive for its lease from now.
    async fn register(&mut self, me: &Me<'_>) -> Result<(), Error>;
    /// Another live relay of another mode: its id and mode.
    async fn other_mode(&mut self, me: &Me<'_>) -> Result<Option<(String, String)>, Error>;
    /// Remove this relay's row.
    async fn unregister(&mut self, me: &Me<'_>) -> Result<(), Error>;
    /// Remove relays dead for more than an hour.
    async fn forget_dead(&mut self) -> Result<(), Error>;
    async fn partition_count(&mut self) -> Result<i64, Error>;
    /// Live relays of this relay's mode (this one included).
    async fn live_relays(&mut self, me: &Me<'_>) -> Result<i64, Error>;
    /// Extend the lease of the partitions this relay still owns; returns them.
    async fn renew(&mut self, me: &Me<'_>) -> Result<Vec<i32>, Error>;
    /// Give up `parts` (owned by this relay).
    async fn give_up(&mut self, me: &Me<'_>, parts: &[i32]) -> Result<(), Error>;
    /// Take up to `want` free or expired partitions, lowest first, skipping those another
    /// heartbeat is taking right now; returns them.
    async fn take(&mut self, me: &Me<'_>, want: i64) -> Result<Vec<i32>, Error>;
    async fn commit(self) -> Result<(), Error>;
    async fn rollback(self) -> Result<(), Error>;
}

/// How a WAL relay's mode starts in the relay registry: `wal:<slot>`. A relay registry row
/// says which source reads the table, so that one table has one source: a WAL relay and a
/// table relay, or WAL relays of two slots, would each deliver every event.
pub(crate) const WAL_MODE: &str = "wal:";

/// Which relays share out the partitions on a database.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Sharing {
    /// Ordered relays only: an unordered relay leases rows and owns no partition (MySQL).
    Ordered,
    /// Unordered relays too: their claims are held by partition as well (PostgreSQL, whose
    /// unordered claim is read-only like its ordered one).
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    All,
}

/// One heartbeat of relay `p.relay_id` on `table`, in the transaction `c`.
pub(crate) async fn rebalance<C: Coordinator>(
    c: C,
    table: &OutboxTable,
    p: RebalanceParams<'_>,
    sharing: Sharing,
) -> Result<Membership, Error> {
    rebalance_as(c, table, p, None, sharing).await
}

/// [`rebalance`], or with `wal_slot`, the heartbeat of a WAL relay reading that slot: it
/// registers as `wal:<slot>` (a table relay of the table, or a WAL relay of another slot, is
/// then a [`Error::SourceConflict`] for whichever comes second) and shares no partitions.
pub(crate) async fn rebalance_as<C: Coordinator>(
    mut c: C,
    table: &OutboxTable,
    p: RebalanceParams<'_>,
    wal_slot: Option<&str>,
    sharing: Sharing,
) -> Result<Membership, Error> {
    let wal_mode = wal_slot.map(|slot| format!("{WAL_MODE}{slot}"));
    let me = Me {
        relay_id: p.relay_id,
        mode: wal_mode.as_deref().unwrap_or(p.ordering.mode_name()),
        instance: p.instance.to_string(),
        lease: p.lease,
    };
    c.lock().await?;
    // A relay id held by another live process: refuse it (its partitions would be shared by
    // two processes, and one's exit would strip the other's).
    if let Some(left) = c.held_elsewhere(&me).await? {
        c.rollback().await?;
        return Err(Error::RelayIdInUse {
            table: table.display(),
            relay_id: p.relay_id.to_owned(),
            remaining_secs: left.max(0.0),
        });
    }
    c.register(&me).await?;
    // Mixing modes on one table would break the ordering guarantee.
    if let Some((other, other_mode)) = c.other_mode(&me).await? {
        // Do not stay registered: the other relay must not see us as a conflict either.
        c.unregister(&me).await?;
        c.commit().await?;
        if me.mode.starts_with(WAL_MODE) || other_mode.starts_with(WAL_MODE) {
            let other_reads = match other_mode.strip_prefix(WAL_MODE) {
                Some(slot) => format!("--source wal, slot {slot}"),
                None => format!("--source table, {other_mode} mode"),
            };
            return Err(Error::SourceConflict {
                table: table.display(),
                other,
                other_reads,
            });
        }
        return Err(Error::ModeConflict {
            table: table.display(),
            other,
            other_mode,
        });
    }
    // Long-dead relays leave the list.
    c.forget_dead().await?;
    if wal_slot.is_some() || (!p.ordering.is_ordered() && sharing == Sharing::Ordered) {
        c.commit().await?;
        return Ok(Membership::default());
    }
    let total = c.partition_count().await?;
    let live = c.live_relays(&me).await?;
    let mut owned = c.renew(&me).await?;
    owned.sort_unstable();
    let total_n = usize::try_from(total).unwrap_or(0);
    let live_n = usize::try_from(live).unwrap_or(1).max(1);
    let target = total_n.div_ceil(live_n);
    let mut acquired = Vec::new();
    let mut released = Vec::new();
    if owned.len() > target && p.may_release {
        released = owned.split_off(target);
        c.give_up(&me, &released).await?;
    } else if owned.len() < target {
        let want = i64::try_from(target - owned.len()).unwrap_or(0);
        acquired = c.take(&me, want).await?;
        acquired.sort_unstable();
        owned.extend(&acquired);
        owned.sort_unstable();
    }
    c.commit().await?;
    Ok(Membership {
        partitions: total_n,
        live_relays: live_n,
        owned,
        target,
        acquired,
        released,
    })
}

/// The number of partitions, read (by `read`) once per store: the migrations fix it.
pub(crate) async fn count_once<T: Copy>(
    cell: &OnceLock<T>,
    read: impl Future<Output = Result<T, Error>>,
) -> Result<T, Error> {
    if let Some(n) = cell.get() {
        return Ok(*n);
    }
    let n = read.await?;
    Ok(*cell.get_or_init(|| n))
}

/// A database's heartbeat statements, filled once when its store is built ([`heartbeat_sql`]).
/// Those that differ between databases in their SQL only bind text in the order given and
/// are run here; the rest the database runs ([`OwnSql`], with `extra` statements of its own).
#[derive(Debug)]
pub(crate) struct HeartbeatSql<S> {
    /// Take the registration lock ([`Coordinator::lock`]).
    pub lock: String,
    /// `relay_id`, `mode` -> the other relay's id and mode.
    pub other_mode: String,
    /// `relay_id`.
    pub unregister: String,
    pub forget_dead: String,
    /// -> the number of partitions.
    pub partition_count: String,
    /// `mode` -> the number of live relays.
    pub live_relays: String,
    pub held_elsewhere: String,
    pub register: String,
    pub renew: String,
    pub give_up: String,
    pub take: String,
    /// The database's own further statements (MySQL's; PostgreSQL has none: `()`).
    #[cfg_attr(not(feature = "mysql"), allow(dead_code))]
    pub extra: S,
}

/// The [`HeartbeatSql`] of database `$db`: its files `sql/partitions_<statement>.sql` (and
/// `partition_count.sql`), filled by `$fill` (a `store::sql::Fill`), and `$extra`.
macro_rules! heartbeat_sql {
    ($db:literal, $fill:expr, $extra:expr) => {{
        use $crate::store::sql::sql_file;
        let f = $fill;
        $crate::store::partitions::HeartbeatSql {
            lock: f.fill(sql_file!($db, "partitions_lock")),
            other_mode: f.fill(sql_file!($db, "partitions_other_mode")),
            unregister: f.fill(sql_file!($db, "partitions_unregister")),
            forget_dead: f.fill(sql_file!($db, "partitions_forget_dead")),
            partition_count: f.fill(sql_file!($db, "partition_count")),
            live_relays: f.fill(sql_file!($db, "partitions_live_relays")),
            held_elsewhere: f.fill(sql_file!($db, "partitions_held_elsewhere")),
            register: f.fill(sql_file!($db, "partitions_register")),
            renew: f.fill(sql_file!($db, "partitions_renew")),
            give_up: f.fill(sql_file!($db, "partitions_give_up")),
            take: f.fill(sql_file!($db, "partitions_take")),
            extra: $extra,
        }
    }};
}
pub(crate) use heartbeat_sql;

/// The steps of a heartbeat whose parameters or steps differ between databases; as on
/// [`Coordinator`], run on the heartbeat's transaction.
pub(crate) trait OwnSql<DB: Database> {
    async fn held_elsewhere(
        &self,
        conn: &mut DB::Connection,
        me: &Me<'_>,
    ) -> Result<Option<f64>, sqlx::Error>;
    async fn register(&self, conn: &mut DB::Connection, me: &Me<'_>) -> Result<(), sqlx::Error>;
    async fn renew(&self, conn: &mut DB::Connection, me: &Me<'_>) -> Result<Vec<i32>, sqlx::Error>;
    async fn give_up(
        &self,
        conn: &mut DB::Connection,
        me: &Me<'_>,
        parts: &[i32],
    ) -> Result<(), sqlx::Error>;
    async fn take(
        &self,
        conn: &mut DB::Connection,
        me: &Me<'_>,
        want: i64,
    ) -> Result<Vec<i32>, sqlx::Error>;
}

/// A heartbeat's transaction on a database that supplies its [`HeartbeatSql`].
pub(crate) struct InTransaction<'c, 'a, DB: Database, S> {
    tx: Transaction<'c, DB>,
    table: &'a OutboxTable,
    sql: &'a HeartbeatSql<S>,
}

impl<'c, 'a, DB: Database, S> InTransaction<'c, 'a, DB, S> {
    /// One heartbeat ([`rebalance`]) of relay `p.relay_id` on `table`, in `tx`, with the
    /// database's statements `sql`, sharing the partitions among the relays `sharing` says.
    pub(crate) async fn rebalance(
        tx: Transaction<'c, DB>,
        table: &'a OutboxTable,
        sql: &'a HeartbeatSql<S>,
        p: RebalanceParams<'_>,
        sharing: Sharing,
    ) -> Result<Membership, Error>
    where
        Self: Coordinator,
    {
        rebalance(Self { tx, table, sql }, table, p, sharing).await
    }

    /// One heartbeat of a WAL relay reading `slot` ([`rebalance_as`]): registered, no
    /// partitions.
    #[cfg_attr(not(feature = "wal"), allow(dead_code))]
    pub(crate) async fn register_wal(
        tx: Transaction<'c, DB>,
        table: &'a OutboxTable,
        sql: &'a HeartbeatSql<S>,
        p: RebalanceParams<'_>,
        slot: &str,
    ) -> Result<Membership, Error>
    where
        Self: Coordinator,
    {
        rebalance_as(
            Self { tx, table, sql },
            table,
            p,
            Some(slot),
            Sharing::Ordered,
        )
        .await
    }

    fn err(&self) -> impl Fn(sqlx::Error) -> Error + 'a {
        let t = self.table;
        move |e| db_error(t, e)
    }

    /// What a step of [`OwnSql`] runs with: the statements, the transaction, the error.
    fn own(
        &mut self,
    ) -> (
        &'a HeartbeatSql<S>,
        &mut DB::Connection,
        impl Fn(sqlx::Error) -> Error + 'a,
    ) {
        let err = self.err();
        (self.sql, &mut *self.tx, err)
    }

    /// A statement of the shared ones with `binds`, on the transaction: its row, if `fetch`.
    async fn shared<'q>(
        &mut self,
        sql: impl FnOnce(&'a HeartbeatSql<S>) -> &'a str,
        binds: &[&'q str],
        fetch: bool,
    ) -> Result<Option<DB::Row>, Error>
    where
        for<'e> &'e mut DB::Connection: Executor<'e, Database = DB>,
        for<'x> DB::Arguments<'x>: IntoArguments<'x, DB>,
        for<'x> &'x str: Encode<'x, DB> + Type<DB>,
    {
        let q = binds
            .iter()
            .fold(sqlx::query::<DB>(sql(self.sql)), |q, b| q.bind(*b));
        let err = self.err();
        if fetch {
            q.fetch_optional(&mut *self.tx).await.map_err(err)
        } else {
            q.execute(&mut *self.tx).await.map_err(err).map(|_| None)
        }
    }
}

impl<'a, DB, S> Coordinator for InTransaction<'_, 'a, DB, S>
where
    DB: Database,
    HeartbeatSql<S>: OwnSql<DB>,
    for<'e> &'e mut DB::Connection: Executor<'e, Database = DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'r> String: Decode<'r, DB> + Type<DB>,
    for<'r> i64: Decode<'r, DB> + Type<DB>,
    usize: ColumnIndex<DB::Row>,
{
    async fn lock(&mut self) -> Result<(), Error> {
        self.shared(|s| &s.lock, &[], false).await.map(drop)
    }

    async fn held_elsewhere(&mut self, me: &Me<'_>) -> Result<Option<f64>, Error> {
        let (own, conn, err) = self.own();
        own.held_elsewhere(conn, me).await.map_err(err)
    }

    async fn register(&mut self, me: &Me<'_>) -> Result<(), Error> {
        let (own, conn, err) = self.own();
        own.register(conn, me).await.map_err(err)
    }

    async fn other_mode(&mut self, me: &Me<'_>) -> Result<Option<(String, String)>, Error> {
        let binds = [me.relay_id, me.mode];
        let row = self.shared(|s| &s.other_mode, &binds, true).await?;
        let pair = row.map(|r| Ok::<_, sqlx::Error>((r.try_get(0)?, r.try_get(1)?)));
        pair.transpose().map_err(Error::Database)
    }

    async fn unregister(&mut self, me: &Me<'_>) -> Result<(), Error> {
        self.shared(|s| &s.unregister, &[me.relay_id], false)
            .await
            .map(drop)
    }

    async fn forget_dead(&mut self) -> Result<(), Error> {
        self.shared(|s| &s.forget_dead, &[], false).await.map(drop)
    }

    async fn partition_count(&mut self) -> Result<i64, Error> {
        let row = self.shared(|s| &s.partition_count, &[], true).await?;
        count(row)
    }

    async fn live_relays(&mut self, me: &Me<'_>) -> Result<i64, Error> {
        let row = self.shared(|s| &s.live_relays, &[me.mode], true).await?;
        count(row)
    }

    async fn renew(&mut self, me: &Me<'_>) -> Result<Vec<i32>, Error> {
        let (own, conn, err) = self.own();
        own.renew(conn, me).await.map_err(err)
    }

    async fn give_up(&mut self, me: &Me<'_>, parts: &[i32]) -> Result<(), Error> {
        let (own, conn, err) = self.own();
        own.give_up(conn, me, parts).await.map_err(err)
    }

    async fn take(&mut self, me: &Me<'_>, want: i64) -> Result<Vec<i32>, Error> {
        let (own, conn, err) = self.own();
        own.take(conn, me, want).await.map_err(err)
    }

    async fn commit(self) -> Result<(), Error> {
        let err = self.err();
        self.tx.commit().await.map_err(err)
    }

    async fn rollback(self) -> Result<(), Error> {
        let err = self.err();
        self.tx.rollback().await.map_err(err)
    }
}

/// The count in the first column of a `count(*)` row (which always comes back).
fn count<R: Row>(row: Option<R>) -> Result<i64, Error>
where
    usize: ColumnIndex<R>,
    for<'r> i64: Decode<'r, R::Database> + Type<R::Database>,
{
    match row {
        Some(r) => r.try_get(0).map_err(Error::Database),
        None => Err(Error::Database(sqlx::Error::RowNotFound)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Ordering;

    /// One relay's view of a table with `free` partitions nobody owns and `owned` its own.
    #[derive(Default)]
    struct Fake {
        total: i64,
        live: i64,
        owned: Vec<i32>,
        free: Vec<i32>,
        other_mode: Option<(String, String)>,
    }

    impl Coordinator for Fake {
        async fn lock(&mut self) -> Result<(), Error> {
            Ok(())
        }
        async fn held_elsewhere(&mut self, _: &Me<'_>) -> Result<Option<f64>, Error> {
            Ok(None)
        }
        async fn register(&mut self, _: &Me<'_>) -> Result<(), Error> {
            Ok(())
        }
        async fn other_mode(&mut self, _: &Me<'_>) -> Result<Option<(String, String)>, Error> {
            Ok(self.other_mode.clone())
        }
        async fn unregister(&mut self, _: &Me<'_>) -> Result<(), Error> {
            Ok(())
        }
        async fn forget_dead(&mut self) -> Result<(), Error> {
            Ok(())
        }
        async fn partition_count(&mut self) -> Result<i64, Error> {
            Ok(self.total)
        }
        async fn live_relays(&mut self, _: &Me<'_>) -> Result<i64, Error> {
            Ok(self.live)
        }
        async fn renew(&mut self, _: &Me<'_>) -> Result<Vec<i32>, Error> {
            // Unsorted, as a database may return them.
            Ok(self.owned.iter().rev().copied().collect())
        }
        async fn give_up(&mut self, _: &Me<'_>, _: &[i32]) -> Result<(), Error> {
            Ok(())
        }
        async fn take(&mut self, _: &Me<'_>, want: i64) -> Result<Vec<i32>, Error> {
            let n = usize::try_from(want).unwrap().min(self.free.len());
            Ok(self.free.drain(..n).rev().collect())
        }
        async fn commit(self) -> Result<(), Error> {
            Ok(())
        }
        async fn rollback(self) -> Result<(), Error> {
            Ok(())
        }
    }

    fn params(may_release: bool) -> RebalanceParams<'static> {
        RebalanceParams {
            relay_id: "r",
            instance: uuid::Uuid::nil(),
            ordering: Ordering::Ordered,
            lease: Duration::from_secs(10),
            may_release,
        }
    }

    fn table() -> OutboxTable {
        OutboxTable::new("public", "events").unwrap()
    }

    #[tokio::test]
    async fn over_its_share_a_relay_gives_up_its_highest_partitions_only_when_it_may() {
        let fake = || Fake {
            total: 8,
            live: 3,
            owned: (0..5).collect(),
            ..Fake::default()
        };
        let m = rebalance(fake(), &table(), params(true), Sharing::Ordered)
            .await
            .unwrap();
        assert_eq!((m.target, m.live_relays, m.partitions), (3, 3, 8));
        assert_eq!((m.owned, m.released), (vec![0, 1, 2], vec![3, 4]));
        let kept = rebalance(fake(), &table(), params(false), Sharing::Ordered)
            .await
            .unwrap();
        assert_eq!(kept.owned, vec![0, 1, 2, 3, 4]);
        assert!(kept.released.is_empty());
    }

    #[tokio::test]
    async fn under_its_share_a_relay_takes_what_is_free_up_to_it() {
        let c = Fake {
            total: 8,
            live: 2,
            owned: vec![6, 1],
            free: vec![2, 3, 4],
            ..Fake::default()
        };
        let m = rebalance(c, &table(), params(true), Sharing::Ordered)
            .await
            .unwrap();
        assert_eq!(m.target, 4);
        assert_eq!(m.acquired, vec![2, 3]);
        assert_eq!(m.owned, vec![1, 2, 3, 6]);
    }

    #[tokio::test]
    async fn an_unordered_relay_takes_partitions_only_where_they_are_shared_with_it() {
        let fake = || Fake {
            total: 8,
            live: 2,
            free: (0..8).collect(),
            ..Fake::default()
        };
        let unordered = RebalanceParams {
            ordering: Ordering::Unordered,
            ..params(true)
        };
        let m = rebalance(fake(), &table(), unordered.clone(), Sharing::All)
            .await
            .unwrap();
        assert_eq!((m.target, m.owned), (4, vec![0, 1, 2, 3]));
        let m = rebalance(fake(), &table(), unordered, Sharing::Ordered)
            .await
            .unwrap();
        assert!(m.owned.is_empty() && m.target == 0, "{m:?}");
    }

    #[tokio::test]
    async fn a_relay_of_the_other_mode_is_a_conflict() {
        let c = Fake {
            other_mode: Some(("u".into(), "unordered".into())),
            ..Fake::default()
        };
        let err = rebalance(c, &table(), params(true), Sharing::Ordered)
            .await
            .unwrap_err();
        assert!(matches!(err, Error::ModeConflict { ref other, .. } if other == "u"));
    }

    #[tokio::test]
    async fn a_relay_of_the_other_source_is_a_conflict_either_way() {
        let c = Fake {
            other_mode: Some(("w".into(), "wal:txoutbox_s".into())),
            ..Fake::default()
        };
        let err = rebalance(c, &table(), params(true), Sharing::Ordered)
            .await
            .unwrap_err();
        assert!(err.is_membership_conflict());
        let text = err.to_string();
        assert!(
            text.contains("relay w") && text.contains("slot txoutbox_s"),
            "{text}"
        );
        let c = Fake {
            other_mode: Some(("t".into(), "ordered".into())),
            ..Fake::default()
        };
        let err = rebalance_as(c, &table(), params(true), Some("s"), Sharing::Ordered)
            .await
            .unwrap_err();
        assert!(
            matches!(err, Error::SourceConflict { ref other_reads, .. } if other_reads == "--source table, ordered mode"),
            "{err}"
        );
        // A WAL relay takes no partitions.
        let c = Fake {
            total: 8,
            live: 1,
            free: (0..8).collect(),
            ..Fake::default()
        };
        let m = rebalance_as(c, &table(), params(true), Some("s"), Sharing::Ordered)
            .await
            .unwrap();
        assert!(m.owned.is_empty());
    }
}
