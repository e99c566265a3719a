#!/usr/bin/env bash
# Where a decode step's time goes, on a few-layer model of the 30b-a3b
# shapes (per-layer costs are the full model's): bench with CUDA graphs,
# then Nsight Compute timing each kernel of a few decode steps (one at a
# time, graphs off) and a per-kernel summary (time, DRAM GB/s).
#   scripts/device/profile_decode.sh [layers] [type] [build]
set -uo pipefail
cd "$(dirname "$0")/../.."
layers=${1:-8}
type=${2:-q4_k_m}
out=${OUT:-/tmp/out}
mkdir -p "$out"
export LD_LIBRARY_PATH=/tmp/devroot/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
bin=build-gpu/bin/moeserve
if [ "${3:-build}" = build ]; then
  scripts/device/build.sh build-gpu 90a moeserve > "$out/build_profile.log" 2>&1 || { tail -30 "$out/build_profile.log"; exit 1; }
fi
model=/tmp/30b-l$layers.$type.gguf
[ -f $model ] || $bin make-model --arch qwen3moe --preset 30b-a3b --layers $layers --type $type --quick-quant -o $model --no-progress \
  | tail -1
$bin bench -m $model -p 512 -n 128 -r 3 --device cuda --parallel 8 2>&1 | grep -E "pp512|tg128|roofline|sequences|error"
export MOESERVE_CUDA_GRAPHS=0
ncu --clock-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \
  --csv --print-units base --launch-count 3000 \
  $bin generate -m $model -p "The quick brown fox" -n 6 --temp 0 --device cuda \
  > /tmp/ncu_decode.csv 2> /tmp/ncu_decode.err
python3 scripts/device/ncu_summary.py /tmp/ncu_decode.csv | tee "$out/profile_l$layers.txt"
