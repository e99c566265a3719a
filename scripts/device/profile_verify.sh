#!/usr/bin/env bash
# Where a verify (or batched decode) forward of a few rows spends its time,
# on a few-layer model of the 30b-a3b shapes (per-layer costs are the full
# model's): the verify cost curve and batched decode with CUDA graphs, then
# Nsight Compute timing each kernel of the curve's forwards (graphs off)
# and a per-kernel summary for 1, 8 and 16 rows.
#   scripts/device/profile_verify.sh [layers] [type] [build|nobuild]
# MODEL=FILE profiles that file instead (e.g. a trained target; layers then only name the outputs).
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
model=${MODEL:-/tmp/30b-l$layers.$type.gguf}
[ -f $model ] || $bin make-model --arch qwen3moe --preset 30b-a3b --layers $layers --type $type --quick-quant \
  --router-skew 0 -o $model --no-progress | tail -1
$bin bench -m $model -p 0 -n 16 -r 1 --device cuda --spec ngram 2>&1 | sed -n '/verify cost/,/x decode/p' \
  | tee "$out/verify_curve_l$layers.txt"
$bin bench -m $model -p 0 -n 64 -r 1 --device cuda --parallel 8,16,32,64 2>&1 | grep -E "tg64|sequences|error" \
  | tee "$out/parallel_l$layers.txt"
export MOESERVE_CUDA_GRAPHS=0
# The prompt, then 5 forwards per row count (1, 2, 4, 8, 16, 32, 64).
timeout 300 ncu --clock-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \
  --csv --print-units base --launch-count ${LAUNCHES:-4300} \
  $bin bench -m $model -p 0 -n 4 -r 1 --device cuda --spec ngram > /tmp/ncu_verify.csv 2> /tmp/ncu_verify.err
for span in 1:6 16:21 21:26; do
  echo "===== forwards $span"
  python3 scripts/device/ncu_summary.py /tmp/ncu_verify.csv --forwards=$span
done | tee "$out/profile_verify_l$layers.txt"
cp /tmp/ncu_verify.csv "$out/" 2>/dev/null; tail -3 /tmp/ncu_verify.err
