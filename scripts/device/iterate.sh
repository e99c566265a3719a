#!/usr/bin/env bash
# One quick round on the GPU machine while working on decode kernels: build
# (sm_90a), the CUDA op tests, the matvec micro-benchmark's decode shapes and
# the 8-layer 30b-a3b bench, each variant named in VARIANTS (env settings,
# ';'-separated, e.g. "MOESERVE_CUDA_EXPERT_MV=tc;"), then the per-kernel
# profile of the default.
#   VARIANTS="A=1;B=2" scripts/device/iterate.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/out}
mkdir -p "$out"
export LD_LIBRARY_PATH=/tmp/devroot/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
scripts/device/build.sh build-gpu 90a moeserve test_kernels_gpu matvec_bench > "$out/build.log" 2>&1 \
  || { grep -E "error|FAILED" "$out/build.log" | head -30; exit 1; }
build-gpu/tests/kernels_gpu/test_kernels_gpu > "$out/tests.log" 2>&1
echo "kernels_gpu: $(grep -E '^\[  (PASSED|FAILED)' "$out/tests.log" | tr '\n' ' ')"
grep -E '^\[  FAILED|Failure' "$out/tests.log" | head -20
bench=$(find build-gpu -name matvec_bench -type f | head -1)
model=/tmp/30b-l8.q4_k_m.gguf
[ -f $model ] || build-gpu/bin/moeserve make-model --arch qwen3moe --preset 30b-a3b --layers 8 --type q4_k_m --quick-quant -o $model \
  --no-progress | tail -1
IFS=';' read -ra variants <<< "${VARIANTS:-}"
for v in "" "${variants[@]}"; do
  echo "== variant: ${v:-default}"
  env $v $bench decode 2>&1 | grep -E "experts|matvec" | head -30
  env $v build-gpu/bin/moeserve bench -m $model -p 512 -n 128 -r 3 --device cuda 2>&1 | grep -E "pp512|tg128"
done
bash scripts/device/profile_decode.sh 8 q4_k_m nobuild 2>&1 | tail -22
