//! The relay end to end against the real databases: delivery, order, dead letters, wake-ups, shutdown, the publish deadline.
//! One test binary for all of them (each file was one of its own), so the suite links once.

#[path = "../common/mod.rs"]
mod common;
mod deadline;
mod differential_pg;
mod differential_tableless_pg;
mod failover_pg;
mod hold_brokers;
mod key_order;
mod lean_pg;
mod ordering_pg;
mod outage;
mod payload_pg;
mod pg;
mod tableless_pg;
mod wakeups;
mod wal_encoding_pg;
mod wal_ownership_pg;
#[path = "wal_pg.rs"]
mod wal_pg;
mod wal_silence_pg;
