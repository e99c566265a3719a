#!/usr/bin/env bash
# Issue 40's open "identical NO" in hybrid placements, isolated on the
# device machine: the tiny qwen3moe quantized to Q4_K_M (the kernels of a
# real file) with every expert on the CPU, speculative (n-gram) against plain
# decoding under the switches that change how cold experts are computed;
# and plain greedy text twice in separate processes (is it deterministic?).
#   scripts/device/spec_identity.sh [tiny]   (carry .devdeps)
#   scripts/device/spec_identity.sh 30b      # the hybrid GPU tests, then make-model 30b-a3b: speculative
#                                            # against plain with --n-cpu-moe 24, and pp512 with the
#                                            # reproducible prefill share against MOESERVE_PREFETCH_SHARE=auto
set -uo pipefail
cd "$(dirname "$0")/../.."
export LD_LIBRARY_PATH=/tmp/devroot/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
out=${OUT:-/tmp/out}
mkdir -p "$out"
bin=build-gpu/bin/moeserve
[ -x $bin ] || scripts/device/build.sh build-gpu 90a moeserve > "$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
if [ "${1:-tiny}" = 30b ]; then
  scripts/device/build.sh build-gpu 90a moeserve test_moe > "$out/build_moe.log" 2>&1 || { tail -30 "$out/build_moe.log"; exit 1; }
  m=/tmp/30b.gguf
  [ -f $m ] || $bin make-model --arch qwen3moe --preset 30b-a3b --type q4_k_m --quick-quant -o $m > /tmp/mk.log 2>&1 &
  MOESERVE_TEST_DEVICE=cuda build-gpu/tests/moe/test_moe --gtest_filter='*Hybrid*:ExpertCost*' 2>&1 | grep -E '^\[  (PASSED|FAILED)|FAILED' | tee "$out/moe.txt"
  wait
  echo "== --n-cpu-moe 24 --spec ngram (reproducible prefill share)" | tee -a "$out/30b.txt"
  $bin bench -m $m -p 512 -n 128 -r 1 --device cuda --n-cpu-moe 24 --spec ngram 2>&1 \
    | grep -E '^\| (code|chat)|tg128|pp512' | tee -a "$out/30b.txt"
  echo "== MOESERVE_PREFETCH_SHARE=auto" | tee -a "$out/30b.txt"
  MOESERVE_PREFETCH_SHARE=auto $bin bench -m $m -p 512 -n 0 -r 3 --device cuda --n-cpu-moe 24 2>&1 | grep pp512 \
    | tee -a "$out/30b.txt"
  echo "== default again" | tee -a "$out/30b.txt"
  $bin bench -m $m -p 512 -n 0 -r 3 --device cuda --n-cpu-moe 24 2>&1 | grep pp512 | tee -a "$out/30b.txt"
  exit 0
fi
m=/tmp/qwen3moe-tiny.q4_k_m.gguf
[ -f $m ] || $bin quantize tests/data/models/qwen3moe-tiny.bf16.gguf $m --type q4_k_m > /dev/null 2>&1
for variant in "" "MOESERVE_EXPERT_WARM=0" "NOPACK" "MOESERVE_CUDA_GRAPHS=0"; do
  args=""
  envs=""
  if [ "$variant" = NOPACK ]; then args="--no-pack"; else envs=$variant; fi
  echo "== --cpu-moe $args $envs"
  env $envs $bin bench -m $m -p 0 -n 128 -r 1 --device cuda --cpu-moe $args --spec ngram 2>&1 | grep -E '^\| (code|chat)'
done
echo "== plain greedy text in separate processes (--cpu-moe, 3 runs)"
for i in 1 2 3; do
  $bin generate -m $m -p 'def quicksort(xs):' -n 96 --temp 0 --device cuda --cpu-moe 2>/dev/null | md5sum
done
echo "== the same all-GPU"
for i in 1 2; do
  $bin generate -m $m -p 'def quicksort(xs):' -n 96 --temp 0 --device cuda 2>/dev/null | md5sum
done
