#!/bin/sh
# Server CPU (utime + stime of every thread, from /proc/PID/stat) for five
# 100,000-update SSE bursts plus 4 s for the store writer to catch up
# (research/benchmarks.md, "The writer's cost per event").
#
#   scripts/writer-cpu.sh BINARY STORE     # STORE: memory or sqlite
set -eu
bin=$1
store=$2
dir=$(mktemp -d)
port=$((20000 + $$ % 20000))
case $store in
memory) store_arg=memory ;;
sqlite) store_arg="sqlite:$dir/s.db" ;;
*) echo "store: memory or sqlite" >&2; exit 2 ;;
esac
SANDBOX_AGENT_DATA_DIR=$dir "$bin" server --no-token --port "$port" --data-dir "$dir" \
    --store "$store_arg" >"$dir/server.log" 2>&1 &
pid=$!
i=0
until curl -sf "http://127.0.0.1:$port/v2/health" >/dev/null; do
    i=$((i + 1))
    [ $i -lt 100 ] || { echo "server did not start" >&2; cat "$dir/server.log" >&2; exit 1; }
    sleep 0.1
done
ticks() { awk '{print $14 + $15}' "/proc/$pid/stat"; }
# The same for SQLite's threads only (sqlx runs each connection on its own).
sqlite_ticks() {
    for task in /proc/$pid/task/*; do
        if grep -q '^sqlx-sqlite' "$task/comm" 2>/dev/null; then
            sed 's/^.*) //' "$task/stat" | awk '{print $12 + $13}'
        fi
    done | awk '{s += $1} END {print s + 0}'
}
hz=$(getconf CLK_TCK)
load=$(cut -d' ' -f1 /proc/loadavg)
before=$(ticks)
sqlite_before=$(sqlite_ticks)
for _ in 1 2 3 4 5; do
    "$bin" bench --url "http://127.0.0.1:$port" --scenario stream >>"$dir/bench.log" 2>&1
done
sleep 4
after=$(ticks)
sqlite_after=$(sqlite_ticks)
rates=$(awk '/^stream \(SSE\)/ {printf "%s ", $5}' "$dir/bench.log")
kill "$pid"
wait "$pid" 2>/dev/null || true
awk -v b="$before" -v a="$after" -v sb="$sqlite_before" -v sa="$sqlite_after" \
    -v hz="$hz" -v bin="$bin" -v store="$store" \
    -v load="$load" -v end="$(cut -d' ' -f1 /proc/loadavg)" \
    'BEGIN { printf "%s %s cpu %.2f s (sqlite threads %.2f s) load %s..%s\n",
             bin, store, (a - b) / hz, (sa - sb) / hz, load, end }'
echo "  SSE updates/s: $rates"
rm -rf "$dir"
