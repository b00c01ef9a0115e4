#!/usr/bin/env python3
"""Summarizes scripts/bench-ab.sh's reports: for each result, the median
over the runs of each side's p50 and p90 (µs), their spread (min–max), and
the ratio of the medians A / B (above 1: B is faster).

    scripts/bench-ab-summary.py OUT
"""
import json
import pathlib
import statistics
import sys


def load(out, side):
    runs = sorted(out.glob(f"{side}-*.json"), key=lambda p: int(p.stem.split("-")[1]))
    results = {}
    for path in runs:
        for result in json.loads(path.read_text())["report"]["results"]:
            if result.get("latency"):
                results.setdefault(result["name"], []).append(result["latency"])
    return results, len(runs)


def main():
    out = pathlib.Path(sys.argv[1])
    a, runs_a = load(out, "a")
    b, runs_b = load(out, "b")
    print(f"runs: A {runs_a}, B {runs_b}; median (min–max) over the runs, µs")
    print(f"{'result':44} {'':4} {'A':>22} {'B':>22} {'A/B':>6}")
    for name in a:
        if name not in b:
            continue
        for key in ("p50_us", "p90_us"):
            xs = [r[key] for r in a[name]]
            ys = [r[key] for r in b[name]]
            ma, mb = statistics.median(xs), statistics.median(ys)
            cell = lambda m, v: f"{m:7.1f} ({min(v):6.1f}–{max(v):6.1f})"
            print(f"{name:44} {key[:3]:4} {cell(ma, xs):>22} {cell(mb, ys):>22} {ma / mb:6.2f}")


if __name__ == "__main__":
    main()
