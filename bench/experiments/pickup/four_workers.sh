#!/bin/bash
# Four `shardq worker` processes on one shard, JOBS jobs at 20 jobs/s; prints the
# breakdown above and the workers' mean pickup (enqueue to handler start) from
# their Prometheus metrics. Usage: SHARDQ_BIN=target/release/shardq
# SHARDQ_CONFIG=one-shard.toml SHARDQ_EXPERIMENT_DSN=... four_workers.sh [JOBS]
here=$(dirname "$0")
"$SHARDQ_BIN" migrate || exit 1
psql "$SHARDQ_EXPERIMENT_DSN" -qc "TRUNCATE workflow_status CASCADE" 2>/dev/null
for p in 9911 9912 9913 9914; do
  RUST_LOG=warn "$SHARDQ_BIN" worker --metrics-addr 127.0.0.1:$p > /dev/null 2>&1 &
done
sleep 3
python3 "$here/enqueue_at_rate.py" "${1:-300}" 20
for p in 9911 9912 9913 9914; do
  curl -s 127.0.0.1:$p/metrics | grep -E "pickup_latency_seconds_(sum|count)" | awk '{print $2}' | paste -sd' '
done | awk '{s += $1; c += $2} END {printf "mean pickup over %d jobs: %.2f ms\n", c, 1000 * s / c}'
kill $(jobs -p) 2>/dev/null; wait
