#!/usr/bin/env python3
"""Summarises an `ncu --csv --print-units base` run of moeserve generate:
forwards are cut at each embedding kernel; by default the first (the
prompt) is skipped and the decode forwards are averaged per kernel name;
with --prefill only the first forward is summarised; with --forwards A:B
the forwards A..B-1 after the one of most rows are averaged, e.g. one row count of
`moeserve bench --spec`'s verify curve (a prompt, then 5 forwards per row
count: 1, 2, 4, 8, 16, 32, 64)."""
import collections
import csv
import sys


def main(path, prefill=False, span=None):
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
    if span is not None:
        # Relative to the forward of most rows (the embedding's grid is one
        # block a row): the verify curve's 256-token prompt.
        rows = [int(f[0][1].strip("()").split(",")[0]) if f else 0 for f in forwards]
        base = rows.index(max(rows)) if rows else 0
        decode = forwards[base + span[0]:base + span[1]]
        print(f"forwards {base + span[0]}..{base + span[1] - 1} of {len(forwards)}, rows "
              f"{sorted(set(rows[base + span[0]:base + span[1]]))}")
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
    print(f"{n} {'prefill' if prefill else 'selected' if span else 'decode'} forwards, {len(decode[0])} kernels each, kernel time {total / 1e3:.1f} us per forward")
    print(f"{'kernel':70s} {'grid':>16s} {'per fwd':>7s} {'us each':>8s} {'us/fwd':>8s} {'share':>6s} {'GB/s':>7s}")
    for (name, grid), (cnt, t, rd, wr) in sorted(agg.items(), key=lambda kv: -kv[1][1]):
        each = t / cnt
        print(f"{name[:70]:70s} {grid[:16]:>16s} {cnt / n:7.1f} {each / 1e3:8.2f} {t / n / 1e3:8.1f} "
              f"{100 * t / n / total:5.1f}% {(rd + wr) / t:7.0f}")


if __name__ == "__main__":
    span = None
    for arg in sys.argv[2:]:
        if arg.startswith("--forwards="):
            a, b = arg.split("=", 1)[1].split(":")
            span = (int(a), int(b))
    main(sys.argv[1], "--prefill" in sys.argv[2:], span)
