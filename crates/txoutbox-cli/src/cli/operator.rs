//! The arguments of the operator's commands: `status`, `slot`, `dlq`, `events`, `demo`.

use clap::{Args, Subcommand};

use crate::values::{parse_slot, parse_state, parse_time};

#[derive(Debug, Args)]
pub struct StatusArgs {
    /// Print JSON instead of a table
    #[arg(long)]
    pub json: bool,
    /// PostgreSQL: the replication slot to show [default: txoutbox_<database>_<schema>_<table>]
    #[arg(long, env = "TXOUTBOX_SLOT", value_name = "NAME", value_parser = parse_slot)]
    pub slot: Option<String>,
}

#[derive(Debug, Args)]
pub struct SlotArgs {
    #[command(subcommand)]
    pub command: SlotCommand,
    /// The replication slot (1 to 63 of a-z, 0-9, _) [default:
    /// txoutbox_<database>_<schema>_<table>, the one `relay --source wal` reads]
    #[arg(
        long,
        env = "TXOUTBOX_SLOT",
        value_name = "NAME",
        value_parser = parse_slot,
        global = true
    )]
    pub slot: Option<String>,
}

#[derive(Debug, Subcommand)]
pub enum SlotCommand {
    /// Show the slot: whether a relay reads it, wal_status, confirmed position, the WAL it
    /// keeps (lag) and how much more it may keep before it is invalidated
    List {
        /// Print JSON lines instead of a table
        #[arg(long)]
        json: bool,
    },
    /// Create the slot unless it exists. It keeps WAL from now until a relay reads it: create
    /// it only for a relay that will (`relay --source wal` creates it by itself too)
    Create {
        /// Print JSON
        #[arg(long)]
        json: bool,
    },
    /// Drop the slot (refused while a relay reads it). Nothing is lost: the next
    /// `relay --source wal` creates it again and delivers the unpublished events from the table
    Drop {
        /// Print JSON
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum DlqCommand {
    /// List dead letters, oldest first
    List {
        #[command(flatten)]
        filter: DlqFilter,
        #[command(flatten)]
        page: PageArgs,
        /// Print JSON lines instead of a table
        #[arg(long)]
        json: bool,
    },
    /// Show one dead letter in full (payload, headers, last error)
    Show {
        id: uuid::Uuid,
        /// Print JSON
        #[arg(long)]
        json: bool,
        /// Print at most this many bytes of the payload (and its length); default: all of it
        #[arg(long, value_name = "BYTES")]
        payload_limit: Option<usize>,
    },
    /// Put dead letters back in line (attempts reset): one by id, or --all matching the filters
    Retry(DlqTarget),
    /// Delete dead letters for good: one by id, or --all matching the filters
    Discard(DlqTarget),
}

#[derive(Debug, Args)]
pub struct DlqTarget {
    /// The event id
    #[arg(required_unless_present = "all", conflicts_with = "all")]
    pub id: Option<uuid::Uuid>,
    /// Every dead letter matching the filters
    #[arg(long)]
    pub all: bool,
    #[command(flatten)]
    pub filter: DlqFilter,
    /// Print JSON
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args, Clone, Default)]
pub struct DlqFilter {
    /// Only this event type
    #[arg(long)]
    pub event_type: Option<String>,
    /// Only this aggregate type
    #[arg(long)]
    pub aggregate_type: Option<String>,
    /// Only this aggregate id
    #[arg(long)]
    pub aggregate_id: Option<String>,
    /// Only events created at or after this RFC 3339 time (e.g. 2024-05-01T12:00:00Z)
    #[arg(long, value_parser = parse_time)]
    pub created_after: Option<chrono::DateTime<chrono::Utc>>,
    /// Only events created before this RFC 3339 time
    #[arg(long, value_parser = parse_time)]
    pub created_before: Option<chrono::DateTime<chrono::Utc>>,
}

/// Keyset pagination: `--after-seq` is the `seq` of the last event of the previous page.
#[derive(Debug, Args, Clone)]
pub struct PageArgs {
    /// At most this many (1 to 1000)
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(i64).range(1..=1000))]
    pub limit: i64,
    /// Only events after this seq (the cursor printed at the end of the previous page)
    #[arg(long)]
    pub after_seq: Option<i64>,
}

#[derive(Debug, Subcommand)]
pub enum EventsCommand {
    /// List events in seq order, filtered by state, type, aggregate and time
    List {
        /// pending, leased, published or dead
        #[arg(long, value_parser = parse_state)]
        state: Option<txoutbox::EventState>,
        #[command(flatten)]
        filter: DlqFilter,
        #[command(flatten)]
        page: PageArgs,
        /// Print JSON lines instead of a table
        #[arg(long)]
        json: bool,
    },
    /// Show one event in full, in whatever state
    Show {
        id: uuid::Uuid,
        /// Print JSON
        #[arg(long)]
        json: bool,
        /// Print at most this many bytes of the payload (and its length); default: all of it
        #[arg(long, value_name = "BYTES")]
        payload_limit: Option<usize>,
    },
}

#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Where to publish (default: stdout:)
    #[arg(
        long,
        env = "TXOUTBOX_PUBLISHER",
        default_value = "stdout:",
        hide_env_values = true
    )]
    pub publisher: String,
    /// How many orders to write
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub orders: u32,
}
