//! Every publisher against its real broker on loopback: the shared conformance suite and what is particular to each broker.
//! One test binary for all of them (each file was one of its own), so the suite links once.

mod amqp;
mod aws;
mod conformance;
mod http;
mod kafka;
mod mqtt;
mod nats;
mod nats_reconnect;
mod redis;
