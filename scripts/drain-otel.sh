#!/usr/bin/env bash
# The cost of tracing on the drain: scripts/drain.sh with OTLP export on (to an endpoint where
# no collector listens, so every export fails and spans are dropped) and off, alternated
# ROUNDS times in one run (the machine is shared: compare within a run), then the medians and
# their ratios: of the publish rate (to the last event's processed_at) and of the rate to the
# relay's exit (which includes up to 1 s of trace flushing).
#   scripts/drain-otel.sh 50000 null:
#   ROUNDS=5 scripts/drain-otel.sh 50000 'nats://127.0.0.1:4222?stream=DRAIN&subject=drain.{aggregate_type}.{event_type}'
# Needs a release build (cargo build --release) and the services of scripts/services.sh.
# BENCH_OUT=docs/bench/FILE also writes the rounds and the result to FILE, with a header
# (scripts/bench-record.sh).
set -euo pipefail
. "$(dirname "$0")/bench-record.sh"
bench_record "$0" "$@"
cd "$(dirname "$0")/.."
n=${1:?usage: scripts/drain-otel.sh N PUBLISHER [relay options]}
publisher=${2:?usage: scripts/drain-otel.sh N PUBLISHER [relay options]}
shift 2
rounds=${ROUNDS:-3}
off=() on=()
# The publish rate (to the last event's processed_at), and the rate to the relay's exit.
rate() { sed -n 's/.* s: \([0-9,]*\) events\/s, peak.*: \([0-9,]*\) events\/s published/\2 \1/p' | tr -d ,; }
for i in $(seq 1 "$rounds"); do
  r=$(env -u OTEL_EXPORTER_OTLP_ENDPOINT -u OTEL_EXPORTER_OTLP_TRACES_ENDPOINT \
        scripts/drain.sh "$n" "$publisher" "$@" | rate)
  off+=("$r"); echo "round $i: tracing off: $r events/s (published, to exit)" >&2
  r=$(OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:9 \
        scripts/drain.sh "$n" "$publisher" "$@" | rate)
  on+=("$r"); echo "round $i: tracing on, no collector: $r events/s (published, to exit)" >&2
done
python3 - "${off[*]}" "${on[*]}" <<'PY'
import statistics, sys
def pairs(s):
    v = [float(x) for x in s.split()]
    return v[0::2], v[1::2]
(off_pub, off_exit), (on_pub, on_exit) = pairs(sys.argv[1]), pairs(sys.argv[2])
for what, off, on in (("published", off_pub, on_pub), ("to exit", off_exit, on_exit)):
    mo, mn = statistics.median(off), statistics.median(on)
    print(f"{what}: tracing off median {mo:,.0f} events/s {off}; tracing on, no collector median {mn:,.0f} events/s {on}; on/off = {mn / mo:.3f}")
PY
