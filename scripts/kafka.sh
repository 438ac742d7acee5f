#!/usr/bin/env bash
# Start a Kafka-compatible broker for the Kafka publisher tests: tansu 0.6.0 (a Kafka broker
# written in Rust, in-memory storage) on 127.0.0.1:9092, installing it with cargo when it is
# missing. Safe to run again: it does nothing when something already answers on the port.
# Topics are not auto-created; the tests create their own. Stop it with SIGTERM
# (pid in /tmp/tansu.pid); its log is /tmp/tansu.log.
set -euo pipefail

PORT=9092
log() { echo "kafka: $*" >&2; }
up() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

export PATH="$HOME/.cargo/bin:$PATH"
if up "$PORT"; then
  exit 0
fi
if ! command -v tansu >/dev/null; then
  log "installing tansu 0.6.0 with cargo (takes a while)"
  cargo install tansu@0.6.0 --locked --features libsql,dynostore
fi
log "starting tansu on 127.0.0.1:$PORT (log: /tmp/tansu.log)"
nohup tansu broker \
  --listener-url "tcp://127.0.0.1:$PORT" \
  --advertised-listener-url "tcp://127.0.0.1:$PORT" \
  --storage-engine memory://tansu/ >/tmp/tansu.log 2>&1 </dev/null &
echo $! >/tmp/tansu.pid
for _ in $(seq 1 60); do
  if up "$PORT"; then
    exit 0
  fi
  if ! kill -0 "$(cat /tmp/tansu.pid)" 2>/dev/null; then
    log "tansu exited; see /tmp/tansu.log"
    tail -20 /tmp/tansu.log >&2 || true
    exit 1
  fi
  sleep 1
done
log "tansu did not start listening on 127.0.0.1:$PORT within 60s; see /tmp/tansu.log"
exit 1
