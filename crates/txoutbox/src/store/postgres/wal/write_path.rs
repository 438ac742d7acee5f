//! What an insert into the outbox table makes the writer pay for, and the lean set-up of a
//! table that only the WAL source's stream reads.
//!
//! `migrate` makes every table for every source. Two parts of it serve the table source
//! alone, and the writers pay for both on every insert:
//!
//! - the **wake-up trigger** (a deferred constraint trigger, run at each commit that inserted
//!   events): it wakes a table relay, or a WAL relay that reads its slot through SQL, waiting
//!   for new events. The WAL source's stream needs no wake-up: the server pushes each
//!   transaction as it commits.
//! - the **partition index** (`(partition_key & 63), seq` over pending rows): the table
//!   source's ordered claim reads the partitions its relay owns through it. The WAL source's
//!   table path claims handed-off rows only, through the `handed_off` index.
//!
//! [`set_write_path`] with [`WritePath::Lean`] disables the trigger and drops the index;
//! [`WritePath::Full`] puts both back. What the table path's recovery needs stays: the
//! primary key (settles by id), the `pending` index (hand-overs by `seq` range, the hand-over
//! of every unpublished event when the slot is lost), `partition_key` and the `blocking`,
//! `handed_off`, `dead` and retention indexes (none of which an insert writes to). A table
//! relay started on a lean table still delivers everything, waking by `--poll-interval` and
//! claiming without the index; it warns so ([`WritePathState::table_source_warning`]).

use sqlx::PgPool;

use super::WalError;
use crate::OutboxTable;

/// What an insert into the outbox table maintains beyond what every source needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WritePath {
    /// The wake-up trigger and the partition index: what `migrate` makes, what the table
    /// source wants.
    Full,
    /// Neither: for a table only the WAL source's stream reads.
    Lean,
}

impl WritePath {
    /// `full` or `lean`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Full => "full",
            Self::Lean => "lean",
        }
    }
}

/// The table's two optional parts as the catalogue has them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WritePathState {
    /// The wake-up trigger exists and is enabled.
    pub wake_trigger: bool,
    /// The partition index exists and is valid (a `CREATE INDEX CONCURRENTLY` that failed
    /// leaves an invalid one, which no claim uses and every insert still pays for).
    pub partition_index: bool,
}

impl WritePathState {
    /// [`WritePath::Full`] or [`WritePath::Lean`] when the two parts agree; `None` when one
    /// is there and the other is not (set by hand, or a change that failed half-way).
    pub fn path(self) -> Option<WritePath> {
        match (self.wake_trigger, self.partition_index) {
            (true, true) => Some(WritePath::Full),
            (false, false) => Some(WritePath::Lean),
            _ => None,
        }
    }

    /// What a table relay (or a WAL relay reading through SQL, for the trigger) loses on this
    /// table, to log at its start; `None` on a full table.
    pub fn table_source_warning(self, table: &OutboxTable) -> Option<String> {
        let missing: Vec<&str> = [
            (!self.wake_trigger).then_some(
                "its wake-up trigger is disabled (new events wait up to --poll-interval)",
            ),
            (!self.partition_index).then_some(
                "its partition index is missing (claims read the pending index instead)",
            ),
        ]
        .into_iter()
        .flatten()
        .collect();
        if missing.is_empty() {
            return None;
        }
        Some(format!(
            "outbox table {} has the WAL source's lean write path: {}; nothing is lost, but \
             the table source is slower on it: `txoutbox migrate --source table` puts both back",
            table.display(),
            missing.join(", and ")
        ))
    }
}

/// The wake-up trigger's name (migration 0001).
fn trigger(table: &OutboxTable) -> String {
    table.derived_unqualified("wake")
}

/// The partition index's definition, as migration 0003 creates it (a test compares the two).
fn partition_index_sql(table: &OutboxTable) -> String {
    format!(
        "CREATE INDEX CONCURRENTLY {} ON {} ((partition_key & 63), seq) \
         WHERE processed_at IS NULL AND dead_at IS NULL",
        table.derived_unqualified("partition_pending"),
        table.qualified()
    )
}

/// The table's write path as the catalogue has it. An unmigrated table is an error that says
/// so.
pub async fn write_path(pool: &PgPool, table: &OutboxTable) -> Result<WritePathState, WalError> {
    let row: Option<(Option<bool>, Option<bool>)> = sqlx::query_as(
        "SELECT (SELECT t.tgenabled <> 'D' FROM pg_trigger t
                  WHERE t.tgrelid = c.oid AND t.tgname = $3),
                (SELECT i.indisvalid FROM pg_class x JOIN pg_index i ON i.indexrelid = x.oid
                  WHERE x.relnamespace = n.oid AND x.relname = $4 AND i.indrelid = c.oid)
         FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE n.nspname = $1 AND c.relname = $2 AND c.relkind IN ('r', 'p')",
    )
    .bind(table.schema().as_str())
    .bind(table.table().as_str())
    .bind(table.derived_name("wake"))
    .bind(table.derived_name("partition_pending"))
    .fetch_optional(pool)
    .await?;
    let Some((trigger, index)) = row else {
        return Err(WalError::Setup(format!(
            "outbox table {} does not exist: run `txoutbox migrate` first",
            table.display()
        )));
    };
    Ok(WritePathState {
        wake_trigger: trigger.unwrap_or(false),
        partition_index: index.unwrap_or(false),
    })
}

/// Give the table `want`'s write path; true if anything changed. Idempotent, and safe while
/// writers and relays run: the index is dropped and built `CONCURRENTLY` (on a large table
/// the build takes a while; writers go on meanwhile), and the trigger is switched with a
/// short lock that waits for running writes. The role must own the table, as for `migrate`.
pub async fn set_write_path(
    pool: &PgPool,
    table: &OutboxTable,
    want: WritePath,
) -> Result<bool, WalError> {
    let now = write_path(pool, table).await?;
    let index = table.derived("partition_pending");
    let mut changed = false;
    match want {
        WritePath::Lean => {
            if now.wake_trigger {
                exec(
                    pool,
                    table,
                    &format!(
                        "ALTER TABLE {} DISABLE TRIGGER {}",
                        table.qualified(),
                        trigger(table)
                    ),
                )
                .await?;
                changed = true;
            }
            if now.partition_index || index_exists(pool, table).await? {
                exec(
                    pool,
                    table,
                    &format!("DROP INDEX CONCURRENTLY IF EXISTS {index}"),
                )
                .await?;
                changed = true;
            }
        }
        WritePath::Full => {
            if !now.partition_index {
                // An invalid one (a build that failed) is dropped first: IF NOT EXISTS would
                // keep it.
                exec(
                    pool,
                    table,
                    &format!("DROP INDEX CONCURRENTLY IF EXISTS {index}"),
                )
                .await?;
                exec(pool, table, &partition_index_sql(table)).await?;
                changed = true;
            }
            if !now.wake_trigger {
                exec(
                    pool,
                    table,
                    &format!(
                        "ALTER TABLE {} ENABLE TRIGGER {}",
                        table.qualified(),
                        trigger(table)
                    ),
                )
                .await?;
                changed = true;
            }
        }
    }
    Ok(changed)
}

/// Whether the partition index exists at all, valid or not.
async fn index_exists(pool: &PgPool, table: &OutboxTable) -> Result<bool, WalError> {
    let found: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM pg_class x JOIN pg_namespace n ON n.oid = x.relnamespace
                         WHERE n.nspname = $1 AND x.relname = $2)",
    )
    .bind(table.schema().as_str())
    .bind(table.derived_name("partition_pending"))
    .fetch_one(pool)
    .await?;
    Ok(found)
}

/// One statement of the change; a role that may not make it is told who may.
async fn exec(pool: &PgPool, table: &OutboxTable, sql: &str) -> Result<(), WalError> {
    match sqlx::raw_sql(sql).execute(pool).await {
        Ok(_) => Ok(()),
        // insufficient_privilege
        Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("42501") => {
            Err(WalError::Setup(format!(
                "changing the write path of outbox table {} needs its owner (the role that \
                 ran `txoutbox migrate`): {}",
                table.display(),
                e.message()
            )))
        }
        Err(e) => Err(e.into()),
    }
}
