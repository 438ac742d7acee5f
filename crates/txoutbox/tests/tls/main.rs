#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test
//! TLS to PostgreSQL and to the brokers, each against a private server this test starts on a
//! free port with certificates made at test time (see `pki`). Needs the server binaries:
//! PostgreSQL in /usr/lib/postgresql/*/bin (or PG_BIN), nats-server, redis-server (built with TLS),
//! mosquitto — scripts/services.sh installs them; tansu for Kafka — scripts/kafka.sh.
#![cfg(all(
    feature = "nats",
    feature = "redis",
    feature = "mqtt",
    feature = "http",
    feature = "amqp",
    feature = "kafka"
))]

mod amqp;
mod brokers;
mod kafka;
mod pg;
#[path = "../common/pg_bin.rs"]
mod pg_bin;
mod pki;
