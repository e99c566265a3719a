#!/usr/bin/env bash
# A hybrid decode step's GPU timeline (issue 20): a few-layer model of the
# 30b-a3b shapes with the experts of the first layers on the CPU, traced with
# Nsight Systems (CUDA graph nodes one by one); prints the last decode
# step's kernels (start, duration, gap before) and the host experts' trace.
#   scripts/device/profile_hybrid.sh [layers] [cpu-moe layers] [build]
# VARIANTS="MOESERVE_MAILBOX_COPY=zero MOESERVE_EXPERT_MAILBOX=0" adds runs with those settings.
set -uo pipefail
cd "$(dirname "$0")/../.."
layers=${1:-8}
ncmoe=${2:-4}
out=${OUT:-/tmp/out}
mkdir -p "$out"
export LD_LIBRARY_PATH=/tmp/devroot/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
bin=build-gpu/bin/moeserve
if [ "${3:-build}" = build ]; then
  scripts/device/build.sh build-gpu 90a moeserve > "$out/build_profile.log" 2>&1 || { tail -30 "$out/build_profile.log"; exit 1; }
fi
model=/tmp/30b-l$layers.q4_k_m.gguf
[ -f $model ] || $bin make-model --arch qwen3moe --preset 30b-a3b --layers $layers --type q4_k_m --quick-quant -o $model \
  --no-progress | tail -1
echo "== bench all on the GPU"
$bin bench -m $model -p 64 -n 128 -r 2 --device cuda 2>&1 | grep -E "tg128|error"
# VARIANTS: settings to compare with --n-cpu-moe (each "ENV=value", or "-" for none).
for v in ${VARIANTS:--}; do
  echo "== bench --n-cpu-moe $ncmoe $v"
  [ "$v" = - ] && v=MOESERVE_EXPERT_TRACE=1
  env MOESERVE_EXPERT_TRACE=1 $v $bin bench -m $model -p 64 -n 128 -r 2 --device cuda --n-cpu-moe $ncmoe 2>&1 \
    | grep -E "tg128|trace|error"
done
nsys=$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -1)
[ -n "$nsys" ] || { echo "no nsys here"; exit 0; }
for args in "" "--n-cpu-moe $ncmoe"; do
  name=all; [ -n "$args" ] && name=hybrid
  $nsys profile -t cuda --cuda-graph-trace=node -o /tmp/prof_$name -f true \
    $bin generate -m $model -p "The quick brown fox" -n 24 --temp 0 --device cuda $args > /dev/null 2>&1
  $nsys stats -r cuda_gpu_trace -f csv -o /tmp/prof_$name /tmp/prof_$name.nsys-rep > /dev/null 2>&1
  csv=$(ls /tmp/prof_${name}_cuda_gpu_trace.csv 2>/dev/null | head -1)
  [ -n "$csv" ] || { echo "no trace for $name"; continue; }
  cp "$csv" "$out/"
  python3 - "$csv" "$name" <<'PY' | tee "$out/timeline_$name.txt"
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
k = [r for r in rows if 'Start (ns)' in r and r.get('Name')]
start = lambda r: int(r['Start (ns)']); dur = lambda r: int(r['Duration (ns)'])
k.sort(key=start)
# The last decode step: from the last argmax back to the previous one.
idx = [i for i, r in enumerate(k) if 'argmax' in r['Name']]
a, b = (idx[-2] + 1, idx[-1] + 1) if len(idx) >= 2 else (max(0, len(k) - 400), len(k))
step = k[a:b]
t0 = start(step[0])
print(f"{sys.argv[2]}: last decode step {(start(step[-1]) + dur(step[-1]) - t0) / 1e3:.1f} us, {len(step)} ops")
prev_end = t0
agg = {}
for r in step:
    n = r['Name'].split('(')[0].split('<')[0][-40:]
    gap = start(r) - prev_end
    agg.setdefault(n, [0, 0, 0])
    agg[n][0] += 1; agg[n][1] += dur(r); agg[n][2] += max(gap, 0)
    prev_end = max(prev_end, start(r) + dur(r))
print(f"{'kernel':42s} {'n':>4s} {'sum us':>9s} {'gaps us':>9s}")
for n, (c, d, g) in sorted(agg.items(), key=lambda x: -x[1][1] - x[1][2]):
    print(f"{n:42s} {c:4d} {d / 1e3:9.1f} {g / 1e3:9.1f}")
print("first two layers:")
for r in step[:60]:
    print(f"  {(start(r) - t0) / 1e3:8.1f} {dur(r) / 1e3:7.1f} {r['Name'][:60]}")
PY
done
