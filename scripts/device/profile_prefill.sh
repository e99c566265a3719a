#!/usr/bin/env bash
# Where a 512-token prefill's time goes, on a few-layer model of the 30b-a3b
# shapes: Nsight Compute times each kernel of the prompt's forward (graphs
# off) and prints a per-kernel summary.  scripts/device/profile_prefill.sh [layers]
set -uo pipefail
cd "$(dirname "$0")/../.."
layers=${1:-8}
out=${OUT:-/tmp/out}
mkdir -p "$out"
export LD_LIBRARY_PATH=/tmp/devroot/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
bin=build-gpu/bin/moeserve
scripts/device/build.sh build-gpu 90a moeserve > "$out/build_prefill.log" 2>&1 || { tail -30 "$out/build_prefill.log"; exit 1; }
model=/tmp/30b-l$layers.q4_k_m.gguf
[ -f $model ] || $bin make-model --arch qwen3moe --preset 30b-a3b --layers $layers --type q4_k_m --quick-quant -o $model --no-progress | tail -1
python3 -c "print(' '.join(['The quick brown fox jumps over the lazy dog.'] * 52))" > /tmp/prompt512.txt
export MOESERVE_CUDA_GRAPHS=0
ncu --clock-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \
  --csv --print-units base --launch-count 2000 \
  $bin generate -m $model -p "$(cat /tmp/prompt512.txt)" -n 1 --temp 0 --device cuda > /tmp/ncu_prefill.csv 2> /tmp/ncu_prefill.err
python3 scripts/device/ncu_summary.py /tmp/ncu_prefill.csv --prefill | tee "$out/profile_prefill.txt"
