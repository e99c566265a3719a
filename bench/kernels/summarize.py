#!/usr/bin/env python3
"""Turn bench_kernels JSON files (--benchmark_out, all repetitions; one or
more runs) into the docs/BENCHMARKS.md tables. Takes the best repetition of
each benchmark over all files: the machine may be shared, and interference
only ever slows a run down. Also prints the CPU/real time ratio of that
repetition (about 1.0 = the main thread was never descheduled).

usage: summarize.py run1.json [run2.json ...]"""
import json
import sys


def best_runs(paths):
    runs = {}
    benchmarks = [b for p in paths for b in json.load(open(p))["benchmarks"]]
    for b in benchmarks:
        if b.get("run_type") != "iteration":
            continue
        name = b["run_name"].replace("/real_time", "")
        rate = b.get("GB/s", b.get("GFLOP/s", -b["real_time"]))
        if name not in runs or rate > runs[name][0]:
            runs[name] = (rate, b)
    return {k: v[1] for k, v in runs.items()}


def main():
    runs = best_runs(sys.argv[1:])
    read = {k: v["GB/s"] for k, v in runs.items() if k.startswith("read/")}
    print("| benchmark | GB/s | cpu/real |\n|---|---:|---:|")
    for k, v in runs.items():
        if k.startswith("read/"):
            print(f"| {k} | {v['GB/s']:.1f} | {v['cpu_time'] / v['real_time']:.2f} |")
    print()
    print("| weight type | MiB | threads | matvec µs | GB/s | % of read BW | cpu/real |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for k, v in runs.items():
        if not k.startswith("matvec/"):
            continue
        _, t, th = k.split("/")
        threads = th.split(":")[1]
        bw = read.get(f"read/1024MiB/threads:{threads}")
        pct = f"{100 * v['GB/s'] / bw:.0f}%" if bw else "-"
        print(f"| {t} | {v['MiB']:.1f} | {threads} | {v['real_time']:.0f} | {v['GB/s']:.1f} | {pct} | "
              f"{v['cpu_time'] / v['real_time']:.2f} |")
    print()
    print("| weight type | threads | matmul T=128 ms | GFLOP/s | cpu/real |\n|---|---:|---:|---:|---:|")
    for k, v in runs.items():
        if k.startswith("matmul/"):
            _, t, th = k.split("/")
            print(f"| {t} | {th.split(':')[1]} | {v['real_time']:.1f} | {v['GFLOP/s']:.1f} | "
                  f"{v['cpu_time'] / v['real_time']:.2f} |")
    for k, v in runs.items():
        if k.startswith("pool/"):
            print(f"\n{k}: {v['real_time']:.0f} ns")


if __name__ == "__main__":
    main()
