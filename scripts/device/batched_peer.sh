#!/usr/bin/env bash
# Batched decode against llama.cpp's `llama-batched-bench` (built from source
# here, scripts/device/llamacpp_gpu.sh) on the same make-model 30b-a3b
# stand-in (8 layers, Q4_K_M), same run (issue 42): aggregate decode tok/s of
# N sequences that each hold a 1,024-token prompt.
#   scripts/device/batched_peer.sh [layers]
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/out}
mkdir -p "$out"
export LD_LIBRARY_PATH=/tmp/devroot/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
layers=${1:-8}
npl=${NPL:-8,32,64}
LLAMA_TARGETS=llama-batched-bench scripts/device/llamacpp_gpu.sh build
scripts/device/build.sh build-gpu 90a moeserve > "$out/build_peer.log" 2>&1 || { tail -30 "$out/build_peer.log"; exit 1; }
bin=build-gpu/bin/moeserve
f=/tmp/peer-30b-l$layers.q4_k_m.gguf
[ -f $f ] || $bin make-model --arch qwen3moe --preset 30b-a3b --layers $layers --type q4_k_m --quick-quant \
  --router-skew 0 -o $f --no-progress > /dev/null 2>&1
max=$(echo $npl | tr ',' '\n' | sort -n | tail -1)
# llama.cpp first: its build must be done (the script waits), and then nothing else runs beside it.
timeout ${LLAMA_WAIT:-520} scripts/device/llamacpp_gpu.sh run llama-batched-bench -m $f -ngl 99 -fa on \
  -c $((max * 1100)) -b 2048 -ub 512 -npp 1024 -ntg 32 -npl $npl 2>&1 | grep -E '^\|' | tee "$out/llama_batched.txt"
$bin bench -m $f -p 0 -n 32 -r 1 --device cuda --parallel $npl --parallel-prompt 1024 2>&1 \
  | grep -E 'decode, |error' | tee "$out/moeserve_batched.txt"
