#!/bin/sh
# Two builds' servers measured by one bench, interleaved A B A B …
# (research/benchmarks.md, "The extension table"): each run starts a fresh
# server of one build (its own data dir, the default SQLite store) and
# points BENCH's `bench --url` at it, so both builds are measured by the
# same client code, even for a scenario the older build's bench lacks.
# One JSON report per run in OUT (a-1.json, b-1.json, …). SERVER_ARGS
# (environment) are added to both servers' arguments, e.g.
# SERVER_ARGS="--store memory".
#
#   scripts/bench-ab.sh BENCH A B RUNS SCENARIOS OUT [BENCH ARGS…]
#   scripts/bench-ab.sh target/release/sandbox-agent /tmp/base target/release/sandbox-agent \
#       5 ext,roundtrip /tmp/ab --duration 3
set -eu
bench=$1 a=$2 b=$3 runs=$4 scenarios=$5 out=$6
shift 6
mkdir -p "$out"

# Starts build $1 on a free port; sets pid and port.
start() {
    dir=$(mktemp -d)
    # shellcheck disable=SC2086 # SERVER_ARGS is a list of words.
    "$1" server --host 127.0.0.1 --port 0 --no-token --data-dir "$dir" ${SERVER_ARGS:-} \
        >"$dir/stdout" 2>"$dir/stderr" &
    pid=$!
    i=0
    until grep -q 'listening on http://' "$dir/stdout" 2>/dev/null; do
        i=$((i + 1))
        [ $i -lt 200 ] || { echo "server $1 did not start" >&2; cat "$dir/stderr" >&2; exit 1; }
        sleep 0.1
    done
    port=$(sed -n 's/.*listening on http:\/\/[^:]*:\([0-9]*\).*/\1/p' "$dir/stdout" | head -n 1)
}

stop() {
    kill -TERM "$pid"
    wait "$pid" 2>/dev/null || true
    rm -rf "$dir"
}

run=1
while [ $run -le "$runs" ]; do
    for side in a b; do
        eval "build=\$$side"
        start "$build"
        "$bench" bench --url "http://127.0.0.1:$port" --scenario "$scenarios" --json "$@" \
            >"$out/$side-$run.json"
        stop
        echo "run $run $side: load $(cut -d' ' -f1 /proc/loadavg)" >&2
    done
    run=$((run + 1))
done
