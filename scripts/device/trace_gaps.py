#!/usr/bin/env python3
"""Cuts an Nsight Systems cuda_gpu_trace CSV into forwards (a gap of more
than --split µs between two kernels ends one) and prints, per forward, its
kernel count, span, the kernels' busy time and the largest gaps inside it
with the kernels on each side: where a forward waits on the host or on
launches rather than computing."""
import argparse
import csv
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--split", type=float, default=40.0, help="µs of idle GPU that ends a forward")
    ap.add_argument("--gaps", type=int, default=4, help="largest gaps to list per forward")
    ap.add_argument("--last", type=int, default=60, help="forwards to print, counted from the end")
    ap.add_argument("--detail", help="also write every forward's kernels (name, µs, gap before) to this file")
    a = ap.parse_args()
    rows = []
    with open(a.csv, newline="") as f:
        for r in csv.DictReader(f):
            name = r.get("Name", "")
            if "[CUDA mem" in name or "memcpy" in name.lower() or "memset" in name.lower():
                kind = "copy"
            else:
                kind = "kernel"
            try:
                start, dur = float(r["Start (ns)"]), float(r["Duration (ns)"])
            except (KeyError, ValueError):
                continue
            rows.append((start, dur, name, kind))
    rows.sort()
    forwards, cur = [], []
    for row in rows:
        if cur and row[0] - (cur[-1][0] + cur[-1][1]) > a.split * 1e3:
            forwards.append(cur)
            cur = []
        cur.append(row)
    if cur:
        forwards.append(cur)
    print(f"{len(rows)} GPU operations, {len(forwards)} forwards (split at {a.split} µs idle)")
    print("| # | kernels | copies | span µs | busy µs | busy % | largest gaps (µs: before -> after) |")
    print("|---:|---:|---:|---:|---:|---:|---|")
    for i, fw in enumerate(forwards[-a.last:]):
        span = (fw[-1][0] + fw[-1][1] - fw[0][0]) / 1e3
        busy = sum(r[1] for r in fw) / 1e3
        gaps = []
        for p, q in zip(fw, fw[1:]):
            gaps.append(((q[0] - p[0] - p[1]) / 1e3, p[2][:40], q[2][:40]))
        gaps.sort(reverse=True)
        desc = "; ".join(f"{g:.1f}: {b} -> {c}" for g, b, c in gaps[: a.gaps])
        k = sum(1 for r in fw if r[3] == "kernel")
        print(f"| {len(forwards) - min(a.last, len(forwards)) + i} | {k} | {len(fw) - k} | {span:.1f} | "
              f"{busy:.1f} | {100 * busy / span if span else 0:.0f} | {desc} |")
    if a.detail:
        with open(a.detail, "w") as out:
            for i, fw in enumerate(forwards):
                out.write(f"== forward {i}: {len(fw)} operations\n")
                prev = None
                for r in fw:
                    gap = (r[0] - prev[0] - prev[1]) / 1e3 if prev else 0.0
                    out.write(f"{gap:8.1f} {r[1] / 1e3:8.1f}  {r[2][:110]}\n")
                    prev = r


if __name__ == "__main__":
    sys.exit(main())
