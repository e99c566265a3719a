#!/usr/bin/env bash
# Issue 43's weight types on gemm_kq.cu's integer kernel, on the device
# machine: the GPU kernel tests, a tiny model quantized to each type
# generating on cuda (and whether its greedy text is the CPU's), then the
# decode products' bandwidth per type (one-token expert products also with
# MOESERVE_CUDA_KQ_VEC=0, gemm_kq.cu's tiles instead of kq_vec.cu; VEC_AB=0
# skips those).
#   scripts/device/kq_types.sh            # build, tests, smoke, bench
#   STEPS="bench" scripts/device/kq_types.sh
# Carry .devdeps for the build, or binaries built here (common.sh:
# BIN_TARBALL; moeserve, tests/kernels_gpu/test_kernels_gpu and
# bench/cuda/matvec_bench).
set -uo pipefail
source "$(dirname "$0")/common.sh"
steps=${STEPS:-build test smoke bench}
mv_bench=$root/bench/cuda/matvec_bench
types=${TYPES:-Q4_K Q6_K Q3_K Q2_K IQ4_XS IQ3_S IQ3_XXS IQ2_S IQ2_XS IQ2_XXS IQ1_M IQ1_S IQ4_NL MXFP4 Q5_0 Q4_1}
expert_types=${EXPERT_TYPES:-Q4_K Q3_K Q2_K IQ4_XS IQ3_S IQ3_XXS IQ2_XS IQ2_XXS IQ1_S}
smoke_types=${SMOKE_TYPES:-q2_k q3_k_m iq4_xs iq3_s iq3_xxs iq2_s iq2_xs iq2_xxs iq1_m iq1_s}
ab=${KQ_AB:-1}  # 0: without the MOESERVE_CUDA_KQ_GEMM=0 runs
[[ " $steps " != *" build "* ]] || device_build build.log moeserve test_kernels_gpu matvec_bench
if [[ " $steps " == *" test "* ]]; then
  # A bound, so that a hung kernel still leaves its log.
  MOESERVE_TEST_DEVICE=cuda timeout "${TEST_TIMEOUT:-420}" $root/tests/kernels_gpu/test_kernels_gpu \
    > /tmp/kernels_gpu.log 2>&1
  rc=$?
  echo "kernels_gpu (cuda): $(grep -E '^\[  (PASSED|FAILED)' /tmp/kernels_gpu.log | tr '\n' ' ') (exit $rc)"
  [ $rc -eq 0 ] || { cp /tmp/kernels_gpu.log "$out/"; grep -E '^\[  FAILED|: Failure$' -A8 /tmp/kernels_gpu.log | head -60;
    grep -q -E '^\[  (PASSED|FAILED)' /tmp/kernels_gpu.log || { echo "no summary: last lines"; tail -5 /tmp/kernels_gpu.log; }; }
fi
if [[ " $steps " == *" smoke "* ]]; then
  m=tests/data/models/qwen3moe-tiny.bf16.gguf
  for t in $smoke_types; do
    $bin quantize $m /tmp/$t.gguf --type $t > /tmp/${t}_quantize.log 2>&1 ||
      { echo "$t: quantize failed: $(tail -2 /tmp/${t}_quantize.log)"; continue; }
    gpu=$($bin generate -m /tmp/$t.gguf -p 'def add(a, b):' -n 24 --temp 0 --device cuda 2> /tmp/${t}_cuda.err)
    rc=$?
    cpu=$($bin generate -m /tmp/$t.gguf -p 'def add(a, b):' -n 24 --temp 0 --device cpu 2> /dev/null)
    echo "$t --device cuda: exit $rc, ${#gpu} bytes, $([ "$gpu" = "$cpu" ] && echo 'the CPU text' || echo 'not the CPU text')"
    [ $rc -eq 0 ] || tail -2 /tmp/${t}_cuda.err
  done
fi
if [[ " $steps " == *" bench "* ]]; then
  # One token through an LM-head-sized matrix (2048 -> 151936: past the L2,
  # bandwidth-bound), then one 30b-a3b layer's experts at 1 and 8 tokens;
  # each again with MOESERVE_CUDA_KQ_GEMM=0 (the kernels these types took
  # before: matvec.cu and gemm.cu's f16 GEMM).
  for t in $types; do
    echo "$t: $($mv_bench $t 151936 2048 1 2>&1 | tail -1)"
    [ "$ab" = 0 ] || echo "$t, KQ_GEMM=0: $(MOESERVE_CUDA_KQ_GEMM=0 $mv_bench $t 151936 2048 1 2>&1 | tail -1)"
  done | tee "$out/lm_head.txt"
  for t in $expert_types; do
    for n in 1 8; do
      echo "$t $n: $($mv_bench experts $t $t $n 2>&1 | tail -2 | tr '\n' ' ')"
      [ "$ab" = 0 ] || echo "$t $n, KQ_GEMM=0: $(MOESERVE_CUDA_KQ_GEMM=0 $mv_bench experts $t $t $n 2>&1 | tail -2 | tr '\n' ' ')"
      [ "$n" != 1 ] || [ "${VEC_AB:-1}" = 0 ] ||
        echo "$t $n, KQ_VEC=0: $(MOESERVE_CUDA_KQ_VEC=0 $mv_bench experts $t $t $n 2>&1 | tail -2 | tr '\n' ' ')"
    done
  done | tee "$out/experts.txt"
fi
