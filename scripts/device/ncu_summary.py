#!/usr/bin/env python3
"""Summarises an `ncu --csv --print-units base` run of moeserve generate:
forwards are cut at each embedding kernel; by default the first (the
prompt) is skipped and the decode forwards are averaged per kernel name;
with --prefill only the first forward is summarised."""
import collections
import csv
import sys


def main(path, prefill=False):
    rows = [r for r in csv.reader(l for l in open(path) if l.startswith('"'))]
    head, rows = rows[0], rows[1:]
    col = {n: i for i, n in enumerate(head)}
    kernels = collections.OrderedDict()  # id -> [name, grid, time_ns, read, write]
    for r in rows:
        k = kernels.setdefault(r[col["ID"]], [r[col["Kernel Name"]], r[col["Grid Size"]], 0.0, 0.0, 0.0])
        v = float(r[col["Metric Value"]].replace(",", ""))
        m = r[col["Metric Name"]]
        if m == "gpu__time_duration.sum":
            k[2] = v
        elif m == "dram__bytes_read.sum":
            k[3] = v
        elif m == "dram__bytes_write.sum":
            k[4] = v
    forwards, cur = [], None
    for name, grid, t, rd, wr in kernels.values():
        short = name.split("(")[0].split("<")[0].replace("void ", "").split("::")[-1]
        tmpl = name[name.find("<"):name.find(">") + 1] if "<" in name else ""
        if "embed" in short:
            cur = []
            forwards.append(cur)
        if cur is not None:
            cur.append((f"{short}{tmpl[:60]}", grid, t, rd, wr))
    decode = forwards[:1] if prefill else forwards[1:]
    if not decode:
        print("no forwards found")
        return
    agg = collections.OrderedDict()
    for f in decode:
        for name, grid, t, rd, wr in f:
            a = agg.setdefault((name, grid), [0, 0.0, 0.0, 0.0])
            a[0] += 1
            a[1] += t
            a[2] += rd
            a[3] += wr
    n = len(decode)
    total = sum(a[1] for a in agg.values()) / n
    print(f"{n} {'prefill' if prefill else 'decode'} forwards, {len(decode[0])} kernels each, kernel time {total / 1e3:.1f} us per forward")
    print(f"{'kernel':70s} {'grid':>16s} {'per fwd':>7s} {'us each':>8s} {'us/fwd':>8s} {'share':>6s} {'GB/s':>7s}")
    for (name, grid), (cnt, t, rd, wr) in sorted(agg.items(), key=lambda kv: -kv[1][1]):
        each = t / cnt
        print(f"{name[:70]:70s} {grid[:16]:>16s} {cnt / n:7.1f} {each / 1e3:8.2f} {t / n / 1e3:8.1f} "
              f"{100 * t / n / total:5.1f}% {(rd + wr) / t:7.0f}")


if __name__ == "__main__":
    main(sys.argv[1], "--prefill" in sys.argv[2:])
