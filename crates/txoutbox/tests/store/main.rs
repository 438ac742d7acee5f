//! The stores against the real databases: the conformance suite on PostgreSQL, MySQL and SQLite, and what is particular to each (PostgreSQL's schema and partitions, MySQL's row locks).
//! One test binary for all of them (each file was one of its own), so the suite links once.

mod bytes;
#[path = "../common/mod.rs"]
mod common;
mod conformance;
mod inbox;
mod membership_pg;
mod mysql;
mod pg;
mod unordered_pg;
mod wal_pg;
mod wal_stream_pg;
mod write_path_pg;
