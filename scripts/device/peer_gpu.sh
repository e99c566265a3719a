#!/usr/bin/env bash
# moeserve and llama.cpp's CUDA build on the same files and GPU, in one call
# each (issue 21's GPU comparison), llama.cpp's llama-bench built there from
# source (scripts/device/llamacpp_gpu.sh; carry .llamasrc and .devdeps).
#   scripts/device/peer_gpu.sh start      # build moeserve, make the small files now and the big ones in the background
#   scripts/device/peer_gpu.sh bench F... # per file: moeserve bench and llama.cpp, pp512 / tg128, all layers on the GPU
# MODELS="35b lagxs" picks the big files `start` makes (see below); REPS (3);
# OURS_ARGS / LLAMA_ARGS add flags to each side (e.g. "--n-cpu-moe 24" and
# "-ncmoe 24"), TAG names that run's output files.
set -uo pipefail
cd "$(dirname "$0")/../.."
export LD_LIBRARY_PATH=/tmp/devroot/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
out=${OUT:-/tmp/out}
mkdir -p "$out" /tmp/peer
bin=build-gpu/bin/moeserve
case "${1:-}" in
  start)
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    scripts/device/build.sh build-gpu 90a moeserve > "$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
    cp "$bin" /tmp/moeserve-mm
    for a in qwen35moe laguna; do
      /tmp/moeserve-mm make-model --arch $a --preset small --type q4_k_m --quick-quant --no-progress \
        -o /tmp/peer/$a-small.gguf 2>&1 | tail -1
    done
    if ! pgrep -f "moeserve-mm make-model" >/dev/null; then
      cmds=""
      for m in ${MODELS:-35b lagxs}; do
        case $m in
          35b) args="--arch qwen35moe --preset 35b-a3b";;
          lagxs) args="--arch laguna --preset laguna-xs";;
          30b) args="--arch qwen3moe --preset 30b-a3b";;
        esac
        f=/tmp/peer/$m.gguf
        [ -f "$f.done" ] || cmds="$cmds /tmp/moeserve-mm make-model $args --type q4_k_m --quick-quant --no-progress -o $f && touch $f.done;"
      done
      [ -n "$cmds" ] && setsid nohup sh -c "$cmds" > /tmp/peer/make.log 2>&1 < /dev/null &
    fi
    scripts/device/llamacpp_gpu.sh build
    echo "started: ${MODELS:-35b lagxs}";;
  bench)
    shift
    for f in "$@"; do
      # The big files are ready once make-model has touched FILE.done.
      case $f in
        *-small.gguf) ;;
        *) for i in $(seq 1 ${WAIT_STEPS:-60}); do [ -f "$f.done" ] && break; sleep 5; done
           [ -f "$f.done" ] || { echo "$f not ready: $(tail -c 300 /tmp/peer/make.log)"; continue; };;
      esac
      n=$(basename "$f" .gguf)${TAG:+_$TAG}
      echo "== $n ($(du -h "$f" | cut -f1))"
      $bin bench -m "$f" -p 512 -n 128 -r "${REPS:-3}" --device cuda ${OURS_ARGS:-} > "$out/ours_$n.txt" 2>&1
      grep -E "pp512|tg128|memory|VRAM|GiB|roofline|error" "$out/ours_$n.txt" | sed 's/^/moeserve: /'
      scripts/device/llamacpp_gpu.sh bench "$f" -p 512 -n 128 -r "${REPS:-3}" -t 16 -ngl 99 -fa 1 ${LLAMA_ARGS:-} \
        > "$out/llama_$n.txt" 2>&1
      grep -E "pp512|tg128|build|rror" "$out/llama_$n.txt" | sed 's/^/llama.cpp: /'
    done;;
  *)
    sed -n 2,7p "$0"
    exit 2;;
esac
