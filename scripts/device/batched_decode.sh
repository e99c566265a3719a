#!/usr/bin/env bash
# Batched decode on the GPU (issue 42's roofline target): aggregate tok/s at
# 8..128 sequences on a few-layer model of the 30b-a3b shapes (per-layer costs
# are the full model's), then Nsight Compute timing every kernel of a few
# 32-row decode steps (graphs off) and a per-kernel summary.
#   scripts/device/batched_decode.sh [bench|profile|both] [layers] [rows]
set -uo pipefail
cd "$(dirname "$0")/../.."
verb=${1:-both}
layers=${2:-8}
rows=${3:-32}
out=${OUT:-/tmp/out}
mkdir -p "$out"
export LD_LIBRARY_PATH=/tmp/devroot/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
bin=build-gpu/bin/moeserve
if [ ! -x "$bin" ] || [ "${BUILD:-1}" = 1 ]; then
  scripts/device/build.sh build-gpu 90a moeserve > "$out/build_batched.log" 2>&1 || { tail -30 "$out/build_batched.log"; exit 1; }
fi
model=/tmp/30b-l$layers.q4_k_m.gguf
[ -f $model ] || $bin make-model --arch qwen3moe --preset 30b-a3b --layers $layers --type q4_k_m --quick-quant \
  -o $model --no-progress | tail -1
if [ "$verb" != profile ]; then
  for kb in ${KV_BLOCKS:-0 32}; do
    $bin bench -m $model -p 0 -n 32 -r 1 --device cuda --parallel ${PARALLEL:-8,32,64,128} --parallel-prompt 1024 \
      --kv-block $kb 2>&1 | grep -E "decode, |error" | tee -a "$out/batched_l$layers.txt"
  done
fi
[ "$verb" = bench ] && exit 0
# Forwards: the tg run's, then one per
# sequence's 64-token prompt (the most rows), then the 32-row decode steps.
export MOESERVE_CUDA_GRAPHS=0
ncu --clock-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \
  --csv --print-units base --launch-count ${LAUNCHES:-8000} \
  $bin bench -m $model -p 0 -n 2 -r 1 --device cuda --parallel $rows --parallel-prompt 64 \
  > /tmp/ncu_batched.csv 2> /tmp/ncu_batched.err
python3 scripts/device/ncu_summary.py /tmp/ncu_batched.csv --forwards=$((rows + 2)):$((rows + 6)) \
  | tee "$out/profile_batched_r$rows.txt"
