#!/usr/bin/env bash
# The issue's GPU benchmark on the device machine. The model is written with
# make-model --quick-quant (plain range scales: about 15x faster to write,
# the same shapes, types and kernels; well under a minute on 16 cores), so
# one call does it all:
#   scripts/device/bench_30b.sh all     # build, make the model, bench pp512/tg128 and 8/32 sequences
# or in two calls (the model made in the background):
#   scripts/device/bench_30b.sh start   # build, start make-model in the background (setsid)
#   scripts/device/bench_30b.sh bench   # wait for the model, then bench
# QUANT=full makes the model with the full scale search instead (~8 min).
# VARIANTS="A=1;B=2 C=3" adds a decode run (tg128) per ';'-separated set of
# environment settings after the main bench (e.g. MOESERVE_CUDA_PREFETCH=0).
set -uo pipefail
cd "$(dirname "$0")/../.."
export LD_LIBRARY_PATH=/tmp/devroot/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
out=${OUT:-/tmp/out}
mkdir -p "$out"
quick=--quick-quant
[ "${QUANT:-quick}" = full ] && quick=
model=/tmp/30b-a3b.q4_k_m${quick:+.quick}.gguf
bin=build-gpu/bin/moeserve
case "${1:-all}" in
  all)
    "$0" start && "$0" bench;;
  start)
    scripts/device/build.sh build-gpu 90a moeserve > "$out/build30.log" 2>&1 || { tail -30 "$out/build30.log"; exit 1; }
    cp "$bin" /tmp/moeserve-mm  # the model maker must not see a rebuilt binary mid-run
    if [ ! -f "$model.done" ] && ! pgrep -f moeserve-mm >/dev/null; then
      setsid nohup sh -c "/tmp/moeserve-mm make-model --arch qwen3moe --preset 30b-a3b --type q4_k_m $quick -o $model \
        && touch $model.done" > /tmp/make30.log 2>&1 < /dev/null &
    fi
    echo "make-model started $(date +%T)";;
  bench)
    for i in $(seq 1 110); do [ -f "$model.done" ] && break; sleep 5; done
    [ -f "$model.done" ] || { echo "model not ready: $(tail -c 300 /tmp/make30.log)"; exit 1; }
    ls -la $model
    $bin bench -m $model -p 512 -n 128 -r 3 --device cuda --parallel 8,32 2>&1 | tee "$out/bench30.txt"
    IFS=';' read -ra variants <<< "${VARIANTS:-MOESERVE_CUDA_GRAPHS=0;MOESERVE_CUDA_PDL=0}"
    for v in "${variants[@]}"; do
      env $v $bin bench -m $model -p 0 -n 128 -r 2 --device cuda 2>&1 | grep -E "\| tg" | sed "s/^/$v: /"
    done;;
esac
