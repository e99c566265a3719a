#!/usr/bin/env bash
# Prices of the decoding rows' kernel choices (issues 40 and 42) on a
# make-model 30b-a3b stand-in (8 layers, Q4_K_M): the verify cost curve
# (a verify's products as 16-row matrix x vector launches) and batched
# decode with products of 17..64 rows as one GEMM (the default) against
# 16-row launches (MOESERVE_CUDA_MATVEC_ROWS=64),
# and decode steps beside another sequence's 512-row prompt chunk with the
# decode rows apart (the default) and together (MOESERVE_CUDA_ROW_GROUPS=0).
#   scripts/device/row_groups_ab.sh [build|nobuild]
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/out}
mkdir -p "$out"
export LD_LIBRARY_PATH=/tmp/devroot/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
bin=build-gpu/bin/moeserve
if [ "${1:-build}" = build ]; then
  scripts/device/build.sh build-gpu 90a moeserve > "$out/build_rows.log" 2>&1 || { tail -30 "$out/build_rows.log"; exit 1; }
fi
f=/tmp/ab-30b-a3b.q4_k_m.gguf
[ -f $f ] || $bin make-model --arch qwen3moe --preset 30b-a3b --layers 8 --type q4_k_m --quick-quant \
  --router-skew 0 -o $f --no-progress > /dev/null 2>&1
for v in MOESERVE_CUDA_MATVEC_ROWS=16 MOESERVE_CUDA_MATVEC_ROWS=64; do
  echo "== $v"
  env $v $bin bench -m $f -p 0 -n 64 -r 2 --device cuda --spec ngram 2>&1 \
    | grep -E '^\| (ms|x decode)|tg64|error' | tee -a "$out/rows_ab.txt"
  env $v $bin bench -m $f -p 0 -n 32 -r 1 --device cuda --parallel ${PARALLEL:-8,24,32,48,64} \
    --parallel-prompt 1024 2>&1 | grep -E 'decode, |error' | tee -a "$out/rows_ab.txt"
done
for v in MOESERVE_CUDA_ROW_GROUPS=1 MOESERVE_CUDA_ROW_GROUPS=0; do
  echo "== $v, beside a 512-row prompt chunk"
  env $v $bin bench -m $f -p 0 -n 16 -r 1 --device cuda --parallel 1,8,32 --parallel-prompt 1024 \
    --parallel-chunk 512 2>&1 | grep -E 'decode, |error' | tee -a "$out/rows_ab.txt"
done
