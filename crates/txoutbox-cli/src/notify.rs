//! Readiness for a service manager (systemd's `Type=notify`, sd_notify(3)): `READY=1` once the
//! relay runs and the admin listener listens, `STOPPING=1` when a shutdown begins.
//!
//! A message goes to the Unix datagram socket named by `NOTIFY_SOCKET`, which systemd sets
//! for a `Type=notify` service. Without that variable each call does nothing, so the relay
//! behaves the same under any other supervisor (a container runtime, Kubernetes, a shell).
//! A message that cannot be sent is logged, never fatal: the relay works either way, and
//! systemd then reports the start as timed out, which says where to look.

/// The relay runs and the admin listener (when enabled) answers: `READY=1`.
pub fn ready() {
    send("READY=1", &[Message::Ready, Message::Status("relaying")]);
}

/// A shutdown began (SIGTERM or SIGINT): `STOPPING=1`, so `systemctl status` shows the
/// service as deactivating while in-flight events settle.
pub fn stopping() {
    send(
        "STOPPING=1",
        &[
            Message::Stopping,
            Message::Status("finishing in-flight events"),
        ],
    );
}

enum Message {
    Ready,
    Stopping,
    Status(&'static str),
}

#[cfg(unix)]
fn send(what: &str, messages: &[Message]) {
    use sd_notify::NotifyState;
    let states: Vec<NotifyState<'_>> = messages
        .iter()
        .map(|m| match m {
            Message::Ready => NotifyState::Ready,
            Message::Stopping => NotifyState::Stopping,
            Message::Status(s) => NotifyState::Status(s),
        })
        .collect();
    if let Err(e) = sd_notify::notify(&states) {
        tracing::warn!(error = %e, "cannot tell the service manager {what} (NOTIFY_SOCKET)");
    }
}

#[cfg(not(unix))]
fn send(_what: &str, _messages: &[Message]) {}
