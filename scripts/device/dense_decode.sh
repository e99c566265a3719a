#!/usr/bin/env bash
# The K-quants' dense products of decode batches on the integer kernel
# (cuda::integer_dense_decode) against the f32 matrix x vector kernels
# (MOESERVE_CUDA_DENSE_DECODE=exact): GPU tests, the verify cost curve and
# batched decode on an 8-layer and the full 48-layer 30b-a3b.
#   scripts/device/dense_decode.sh [build|nobuild]
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/out}
mkdir -p "$out"
export LD_LIBRARY_PATH=/tmp/devroot/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
bin=build-gpu/bin/moeserve
m8=/tmp/30b-l8.q4_k_m.gguf
m48=/tmp/30b-skew0.gguf
if [ "${1:-build}" = build ]; then
  scripts/device/build.sh build-gpu 90a moeserve > "$out/build.log" 2>&1 || { grep -E 'error|FAILED' -A3 "$out/build.log" | head -30; exit 1; }
fi
[ -f $m48 ] || (setsid nohup $bin make-model --arch qwen3moe --preset 30b-a3b --type q4_k_m --quick-quant --router-skew 0 \
  -o $m48 --no-progress > /tmp/make48.log 2>&1 < /dev/null &)
[ -f $m8 ] || $bin make-model --arch qwen3moe --preset 30b-a3b --layers 8 --type q4_k_m --quick-quant --router-skew 0 \
  -o $m8 --no-progress | tail -1
if [ "${1:-build}" = build ]; then
  scripts/device/build.sh build-gpu 90a test_kernels_gpu test_models test_spec matvec_bench >> "$out/build.log" 2>&1 \
    || { grep -E 'error|FAILED' -A3 "$out/build.log" | head -30; exit 1; }
fi
build-gpu/tests/kernels_gpu/test_kernels_gpu > "$out/kernels_gpu.log" 2>&1
echo "kernels_gpu: $(grep -E '^\[  (PASSED|FAILED)' "$out/kernels_gpu.log" | tr '\n' ' ')"
grep -E '^\[  FAILED|Failure' -A6 "$out/kernels_gpu.log" | head -30
MOESERVE_TEST_DEVICE=cuda build-gpu/tests/models/test_models > "$out/models.log" 2>&1
echo "models (cuda): $(grep -E '^\[  (PASSED|FAILED)' "$out/models.log" | tr '\n' ' ')"
grep -E '^\[  FAILED|Failure' -A6 "$out/models.log" | head -30
MOESERVE_TEST_DEVICE=cuda build-gpu/tests/spec/test_spec > "$out/spec.log" 2>&1
echo "spec (cuda): $(grep -E '^\[  (PASSED|FAILED)' "$out/spec.log" | tr '\n' ' ')"
mvb=$(find build-gpu -name matvec_bench -type f | head -1)
for mode in integer exact; do
  [ $mode = exact ] && export MOESERVE_CUDA_DENSE_DECODE=exact || unset MOESERVE_CUDA_DENSE_DECODE
  for n in 1 8 16; do echo "$mode, LM head: $($mvb Q6_K 151936 2048 $n 2>&1 | tail -1)"; done
done 2>&1 | sed -E 's/ +/ /g' | tee "$out/dense_decode_lm_head.txt"
for i in $(seq 1 60); do [ -f $m48 ] && ! pgrep -f "make-model" >/dev/null && break; sleep 3; done
for run in "$m8 integer" "$m48 integer" "$m48 exact"; do
  read -r m mode <<< "$run"
  [ $mode = exact ] && export MOESERVE_CUDA_DENSE_DECODE=exact || unset MOESERVE_CUDA_DENSE_DECODE
  {
    echo "===== $m, $mode"
    $bin bench -m $m -p 512 -n 128 -r 2 --device cuda --parallel 8,16,32 --spec ngram 2>&1 \
      | grep -E "pp512|tg128|sequences|verify cost|^\| (rows|ms|x decode)|error"
  }
done 2>&1 | tee "$out/dense_decode_bench.txt"
