#!/usr/bin/env bash
# A/B of the few-row product switches on the verify cost curve and decode
# (issue 40): each model of MODELS (make-model stand-ins: small qwen3moe
# shapes and the 30b-a3b ones, 8 layers) under each environment of VARIANTS.
#   scripts/device/verify_ab.sh [build|nobuild]
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/out}
mkdir -p "$out"
export LD_LIBRARY_PATH=/tmp/devroot/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
bin=build-gpu/bin/moeserve
if [ "${1:-build}" = build ]; then
  scripts/device/build.sh build-gpu 90a moeserve ${TARGETS:-} > "$out/build_ab.log" 2>&1 || { tail -30 "$out/build_ab.log"; exit 1; }
fi
models=${MODELS:-"small:q8_0 small:q4_k_m 30b-a3b:q4_k_m"}
for m in $models; do
  preset=${m%%:*} type=${m##*:}
  f=/tmp/ab-$preset.$type.gguf
  [ -f $f ] || $bin make-model --arch qwen3moe --preset $preset --layers 8 --type $type --quick-quant \
    --router-skew 0 -o $f --no-progress > /dev/null 2>&1
done
variants=${VARIANTS:-"MOESERVE_CUDA_TC_PAIR_CHUNK=16 MOESERVE_CUDA_TC_PAIR_CHUNK=auto MOESERVE_CUDA_DENSE_MATVEC=tc"}
for m in $models; do
  preset=${m%%:*} type=${m##*:}
  for v in $variants; do
    echo "== $preset $type (8 layers), $v"
    env $v $bin bench -m /tmp/ab-$preset.$type.gguf -p 0 -n 64 -r 2 --device cuda --spec ngram 2>&1 \
      | grep -E '^\| (ms|x decode)|tg64|error' | tee -a "$out/verify_ab.txt"
    # PARALLEL=8,16: batched decode of that many sequences too.
    [ -z "${PARALLEL:-}" ] || env $v $bin bench -m /tmp/ab-$preset.$type.gguf -p 0 -n 64 -r 1 --device cuda \
      --parallel $PARALLEL 2>&1 | grep -E 'sequences|error' | tee -a "$out/verify_ab.txt"
  done
done
