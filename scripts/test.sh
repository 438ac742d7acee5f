#!/usr/bin/env bash
# The whole test suite, against real services: starts what is not running, then runs every
# test of the workspace. Extra arguments go to `cargo test` (e.g. a test name filter).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build-deps.sh   # libssl-dev and pkg-config: librdkafka is built with TLS
scripts/services.sh
scripts/kafka.sh   # a Kafka-protocol broker (tansu), installed with cargo on a new machine
scripts/tools.sh || echo "test: could not install chromium/promtool; the browser test will skip outside CI" >&2
if command -v promtool >/dev/null; then
  promtool check rules deploy/prometheus/txoutbox-rules.yml
  promtool test rules deploy/prometheus/txoutbox-rules.test.yml
elif [ -n "${CI:-}" ]; then
  echo "test: promtool is missing" >&2; exit 1
fi
export DATABASE_URL="${TEST_DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test}"
export MYSQL_URL="${MYSQL_URL:-mysql://root@127.0.0.1:3306/test}"
export NATS_URL="${NATS_URL:-nats://127.0.0.1:4222}"
export AMQP_URL="${AMQP_URL:-amqp://guest:guest@127.0.0.1:5672/%2f}"
export KAFKA_BROKERS="${KAFKA_BROKERS:-127.0.0.1:9092}"
# moto (scripts/services.sh) for the sqs://, sns:// and kinesis:// tests, with dummy credentials (moto takes
# any); set here rather than by the test process, which then need not change its environment.
export SQS_ENDPOINT="${SQS_ENDPOINT:-http://127.0.0.1:4566}"
export AWS_ACCESS_KEY_ID="${AWS_ACCESS_KEY_ID:-testing}"
export AWS_SECRET_ACCESS_KEY="${AWS_SECRET_ACCESS_KEY:-testing}"
export AWS_REGION="${AWS_REGION:-us-east-1}"
# Official clients (CloudEvents SDK, confluent-kafka) that tests read our messages with.
if TXOUTBOX_CLIENTS_PYTHON="$(scripts/clients.sh)"; then
  export TXOUTBOX_CLIENTS_PYTHON
elif [ -n "${CI:-}" ]; then
  echo "test: could not install the official clients (scripts/clients.sh)" >&2; exit 1
else
  echo "test: could not install the official clients; the tests that use them will skip" >&2
fi
cargo test --workspace --all-features "$@"
# The Kafka gap tests depend on the timing of librdkafka's mock broker (see the tests'
# comments): each runs on its own, and must pass once in three tries.
if [ $# -eq 0 ]; then
  for gap_test in \
      "publish kafka::a_fatal_producer_error_keeps_the_gap_closed_and_the_producer_is_rebuilt" \
      "relay key_order::kafka_relay_recovers_from_a_fatal_producer_error_in_order"; do
    read -r binary name <<<"$gap_test"
    for try in 1 2 3; do
      if cargo test -p txoutbox --all-features --test "$binary" -- --ignored --exact "$name"; then
        break
      fi
      if [ "$try" = 3 ]; then
        echo "test: $name failed three times" >&2; exit 1
      fi
      echo "test: $name failed (try $try of 3); again" >&2
    done
  done
fi
# Short fault-injection runs (fixed seed, every fault kind, about 90 s each; see
# docs/guarantees.md): the table source, then the WAL source (slot loss too). Skipped when
# arguments pick tests, or with CHAOS=0.
if [ $# -eq 0 ] && [ "${CHAOS:-1}" != 0 ]; then
  scripts/chaos.sh
  scripts/chaos.sh --source wal
fi
# The counted regression gate (docs/performance.md#the-counted-gate): bytes, round trips and WAL
# per event of a drain against docs/bench/costs.json. Last and alone: the WAL count is the
# server's. Skipped when arguments pick tests.
if [ $# -eq 0 ]; then
  scripts/cost-gate.sh
fi
