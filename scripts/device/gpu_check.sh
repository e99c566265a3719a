#!/usr/bin/env bash
# One call on the GPU machine: build (one architecture), run the GPU tests,
# compare GPU and CPU generation on the tiny trained models, and benchmark.
# Logs go to $OUT (at most 8 files come back) and a summary to stdout.
#   [BENCH_ARCH=qwen3moe] scripts/device/gpu_check.sh [tests|bench|all] [bench model preset]
set -uo pipefail
cd "$(dirname "$0")/../.."
what=${1:-all}
preset=${2:-small}
out=${OUT:-/tmp/out}
mkdir -p "$out"
export LD_LIBRARY_PATH=/tmp/devroot/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv,noheader
scripts/device/build.sh build-gpu 90a moeserve test_kernels_gpu test_models test_runtime test_server > "$out/build.log" 2>&1 \
  || { tail -40 "$out/build.log"; exit 1; }
bin=build-gpu/bin/moeserve
if [ "$what" = tests ] || [ "$what" = all ]; then
  build-gpu/tests/kernels_gpu/test_kernels_gpu > "$out/tests.log" 2>&1
  echo "kernels_gpu: $(grep -E '^\[  (PASSED|FAILED)' "$out/tests.log" | tr '\n' ' ')"
  grep -E '^\[  FAILED' "$out/tests.log" | head -20
  for gemm in 1 0; do
    MOESERVE_TEST_DEVICE=cuda MOESERVE_CUDA_GEMM=$gemm build-gpu/tests/models/test_models --gtest_filter='*Gpu*:Placement*' \
      > "$out/models_gemm$gemm.log" 2>&1
    echo "models (gpu, MOESERVE_CUDA_GEMM=$gemm): $(grep -E '^\[  (PASSED|FAILED)|parity-gpu' "$out/models_gemm$gemm.log" | tr '\n' ' ')"
  done
  grep -E 'Failure|differ|Which is' "$out/models_gemm1.log" | head -20
  # The engine and the OpenAI service suites with the model on the GPU.
  MOESERVE_TEST_DEVICE=cuda build-gpu/tests/runtime/test_runtime > /tmp/runtime_gpu.log 2>&1
  MOESERVE_TEST_DEVICE=cuda build-gpu/tests/server/test_server > /tmp/server_gpu.log 2>&1
  echo "runtime (gpu): $(grep -E '^\[  (PASSED|FAILED)' /tmp/runtime_gpu.log | tr '\n' ' ')"
  echo "server (gpu): $(grep -E '^\[  (PASSED|FAILED)' /tmp/server_gpu.log | tr '\n' ' ')"
  grep -hE '^\[  FAILED|Failure' /tmp/runtime_gpu.log /tmp/server_gpu.log | head -10
  # Too little GPU memory for the KV cache: one clear error at start.
  timeout 60 $bin serve -m tests/data/models/qwen3moe-tiny.bf16.gguf --device cuda --ctx-size 1048576 --parallel 64 \
    --port 18123 2>&1 | grep -E "error" | head -2
  for m in qwen3moe-tiny qwen3-tiny qwen35moe-tiny laguna-tiny; do
    for d in cpu cuda; do
      $bin generate -m tests/data/models/$m.bf16.gguf -p "def fibonacci(n):" -n 64 --temp 0 --device $d \
        > "/tmp/gen_${m}_$d.txt" 2> "/tmp/gen_${m}_$d.err"
    done
    if cmp -s "/tmp/gen_${m}_cpu.txt" "/tmp/gen_${m}_cuda.txt"; then echo "generate $m: GPU == CPU"; else
      echo "generate $m: GPU != CPU"; head -c 300 "/tmp/gen_${m}_cuda.txt"; tail -3 "/tmp/gen_${m}_cuda.err"; fi
  done
  # Hybrid placement on a model with a dense first layer (Laguna): same text.
  $bin generate -m tests/data/models/laguna-tiny.bf16.gguf -p "def fibonacci(n):" -n 64 --temp 0 --device cuda \
    --n-cpu-moe 2 > /tmp/gen_laguna_hybrid.txt 2> /tmp/gen_laguna_hybrid.err
  if cmp -s /tmp/gen_laguna-tiny_cpu.txt /tmp/gen_laguna_hybrid.txt; then echo "generate laguna --n-cpu-moe 2: == CPU"; else
    echo "generate laguna --n-cpu-moe 2: != CPU"; tail -3 /tmp/gen_laguna_hybrid.err; fi
fi
if [ "$what" = bench ] || [ "$what" = all ]; then
  arch=${BENCH_ARCH:-qwen3moe}  # make-model --arch of the benchmark model
  model=/tmp/$arch-$preset.gguf
  [ -f $model ] || time $bin make-model --arch $arch --preset $preset --type q4_k_m --quick-quant -o $model > /dev/null 2>&1
  for g in 1 0; do
    echo "== bench $preset, MOESERVE_CUDA_GRAPHS=$g"
    MOESERVE_CUDA_GRAPHS=$g $bin bench -m $model -p 512 -n 128 -r 3 --device cuda --parallel 8,32 2>&1 | tee -a "$out/bench.txt" \
      | grep -E "pp512|tg128|roofline|sequences|error"
  done
fi
