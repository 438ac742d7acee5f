//! The `txoutbox` daemon as its users run it: the binary started as a child process against
//! the real databases and brokers (commands, bad input, secrets, the admin listener and
//! dashboard, traces, ordering across processes). One test binary for all of them.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

mod amqp_daemon;
mod aws_cli;
mod bad_input;
mod binary_cli;
mod bytes_cli;
mod commands;
#[path = "../common/mod.rs"]
mod common;
mod config_check;
mod dashboard_browser;
mod dashboard_outage;
mod databases_cli;
mod drain_cli;
mod memory_cli;
mod notify_cli;
mod ops;
mod ordering_process;
mod otel;
mod outboxes_cli;
mod relay_process;
mod replay_cli;
mod replay_nats;
mod replay_wal;
mod routes_cli;
mod secrets;
mod settings_cli;
mod startup;
mod undecodable_rows;
mod wal_cli;
mod wal_ops_cli;
