//! Every publisher against its real broker on loopback: the shared conformance suite and what is particular to each broker.
//! One test binary for all of them (each file was one of its own), so the suite links once.

mod amqp;
mod aws;
mod conformance;
mod http;
mod kafka;
mod kinesis;
mod moto;
mod mqtt;
mod nats;
mod nats_reconnect;
mod protobuf;
mod redis;
mod routes;

/// The official Python clients of `scripts/clients.sh` (`TXOUTBOX_CLIENTS_PYTHON`, which
/// `scripts/test.sh` sets): `None`, with a message, when they are not installed, except under
/// CI, where that fails.
#[cfg(any(feature = "kafka", feature = "sqs", feature = "kinesis"))]
pub fn clients_python() -> Option<String> {
    match std::env::var("TXOUTBOX_CLIENTS_PYTHON") {
        Ok(p) if !p.is_empty() => Some(p),
        _ => {
            assert!(
                std::env::var_os("CI").is_none(),
                "TXOUTBOX_CLIENTS_PYTHON is required in CI (scripts/test.sh sets it)"
            );
            eprintln!("skipping the official-client check: run scripts/test.sh, or set TXOUTBOX_CLIENTS_PYTHON=$(scripts/clients.sh)");
            None
        }
    }
}
