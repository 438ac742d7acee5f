#!/usr/bin/env bash
# The relay to Amazon SQS on the local emulator (moto, started by scripts/services.sh), beside
# null: and the SQS publisher alone: `txoutbox-bench publish`, then `txoutbox-bench drain`, one
# run each, a standard and a FIFO queue, each run on queues created for it (the emulator slows
# down as a queue fills, so a queue is never reused and runs stay small).
#   scripts/bench-sqs.sh                # 500 events (about a minute)
#   EVENTS=1000 scripts/bench-sqs.sh    # other sizes; extra arguments go to txoutbox-bench drain
# What this measures is the emulator's speed, not SQS's: a number for real SQS needs real SQS.
set -euo pipefail
cd "$(dirname "$0")/.."
export DATABASE_URL=${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test}
export TXOUTBOX_LOG=${TXOUTBOX_LOG:-warn}
export AWS_ACCESS_KEY_ID=${AWS_ACCESS_KEY_ID:-testing} AWS_SECRET_ACCESS_KEY=${AWS_SECRET_ACCESS_KEY:-testing}
export AWS_REGION=${AWS_REGION:-us-east-1}
endpoint=${SQS_ENDPOINT:-http://127.0.0.1:4566}
events=${EVENTS:-500}
release="${CARGO_TARGET_DIR:-target}/release"
cargo build --release -p txoutbox-cli --bin txoutbox
cargo build --release -p txoutbox-bench
export TXOUTBOX_BIN=$release/txoutbox
python=$(scripts/clients.sh)   # boto3, to create the queues

# Fresh queues bench-<tag> and bench-<tag>.fifo; every other queue of the emulator is deleted.
queues() {
  AWS_DEFAULT_REGION=$AWS_REGION "$python" - "$endpoint" "$1" <<'PY'
import sys, boto3
endpoint, tag = sys.argv[1], sys.argv[2]
sqs = boto3.client("sqs", endpoint_url=endpoint)
for url in sqs.list_queues().get("QueueUrls", []):
    sqs.delete_queue(QueueUrl=url)
sqs.create_queue(QueueName=f"bench-{tag}")
sqs.create_queue(QueueName=f"bench-{tag}.fifo", Attributes={"FifoQueue": "true"})
PY
}

q="endpoint=$endpoint&region=$AWS_REGION"
for scenario in publish drain; do
  tag="$scenario-$$"
  queues "$tag"
  extra=()
  # Batches of 50: the emulator sends about 150 messages/s, so a claim stays far within its
  # lease even as its queue slows it down.
  [ "$scenario" = drain ] && extra=(--relay-arg=--batch-size=50 "$@")
  "$release/txoutbox-bench" "$scenario" --events "$events" --repeats 1 \
    --publisher null: \
    --publisher "sqs://bench-$tag?$q" \
    --publisher "sqs://bench-$tag.fifo?$q" "${extra[@]}"
done
