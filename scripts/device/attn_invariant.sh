#!/usr/bin/env bash
# Batch-invariant attention (issue 40's GPU losslessness): the attention GPU
# tests, then on make-model stand-ins (random weights: flat distributions,
# near-ties everywhere, so a row that differs in its last bits between a
# verify and a decode shows up as "identical NO") speculative decoding with
# every step drafting, and decode / batched decode speed, with and without
# MOESERVE_CUDA_ATTN_INVARIANT=0.
#   scripts/device/attn_invariant.sh [build|nobuild]
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/out}
mkdir -p "$out"
export LD_LIBRARY_PATH=/tmp/devroot/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
bin=build-gpu/bin/moeserve
if [ "${1:-build}" = build ]; then
  scripts/device/build.sh build-gpu 90a moeserve test_kernels_gpu > "$out/build_attn.log" 2>&1 \
    || { grep -E 'error|FAILED' -A3 "$out/build_attn.log" | head -30; exit 1; }
fi
# The plans by occupancy keep their own run (the switch is read once a process).
for v in MOESERVE_DEFAULTS=1 MOESERVE_CUDA_ATTN_INVARIANT=0; do
  skip=; [ "$v" = MOESERVE_DEFAULTS=1 ] || skip=':-*BatchInvariant*'  # the invariance is what =0 gives up
  env $v build-gpu/tests/kernels_gpu/test_kernels_gpu --gtest_filter="Attention*:TreeAttention*$skip" \
    > "$out/attention_gpu_${v%%=*}.log" 2>&1
  echo "attention tests, $v: $(grep -E '^\[  (PASSED|FAILED)' "$out/attention_gpu_${v%%=*}.log" | tr '\n' ' ')"
  grep -E '^\[  FAILED|Failure' -A6 "$out/attention_gpu_${v%%=*}.log" | head -30
done
for m in ${MODELS:-small:q4_k_m 30b-a3b:q4_k_m}; do  # unquoted: one word per model
  preset=${m%%:*} type=${m##*:}
  f=/tmp/ab-$preset.$type.gguf
  [ -f $f ] || $bin make-model --arch qwen3moe --preset $preset --layers 8 --type $type --quick-quant \
    --router-skew 0 -o $f --no-progress > /dev/null 2>&1
  for v in MOESERVE_CUDA_ATTN_INVARIANT=0 MOESERVE_DEFAULTS=1; do
    echo "== $preset $type (8 layers), $v"
    env $v $bin bench -m $f -p ${PROMPT:-512} -n 64 -r 2 --device cuda --spec ngram --spec-fixed --spec-max 15 2>&1 \
      | grep -E 'tg64|pp[0-9]|^\| (ms|code|chat)|error' | tee -a "$out/attn_invariant.txt"
    env $v $bin bench -m $f -p 0 -n 64 -r 1 --device cuda --parallel 8,32 2>&1 | grep -E 'sequences|error' \
      | tee -a "$out/attn_invariant.txt"
  done
done
