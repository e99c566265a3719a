#!/usr/bin/env bash
# Issue 43's model benchmark on the device machine: make-model 30b-a3b in
# low-bit mixes (Q2_K, IQ4_XS, IQ2_XXS by default), each benched all-GPU and
# with every expert on the CPU (`--cpu-moe`; llama.cpp: `-ncmoe 99`), tg128
# and pp512, against llama.cpp's `llama-bench` built from source there
# (scripts/device/llamacpp_gpu.sh) on the same files, same run.
# Carry .devdeps and .llamasrc (10 MB together). Two calls:
#   scripts/device/lowbit_30b.sh start   # build moeserve, start llama-bench's build and the models
#                                        # (in the background, one after another)
#   scripts/device/lowbit_30b.sh bench   # waits for each model, then both engines on it
# MIXES="q2_k iq4_xs iq2_xxs" picks the files; CPU_MOE=0 skips the --cpu-moe runs.
set -uo pipefail
source "$(dirname "$0")/common.sh"
mixes=${MIXES:-q2_k iq4_xs iq2_xxs}
file_of() { echo "/tmp/30b-a3b.$1.gguf"; }
case "${1:-}" in
  start)
    device_build lowbit_build.log moeserve
    cp "$bin" /tmp/moeserve-mm  # the model maker must not see a rebuilt binary mid-run
    LLAMA_TARGETS=llama-bench scripts/device/llamacpp_gpu.sh build
    cmds=
    for m in $mixes; do
      f=$(file_of "$m")
      # --quick-quant: the K-quant scale search skipped where it has a quick
      # form; the types, shapes and kernels are those of the real mix.
      [ -f "$f.done" ] || cmds="$cmds /tmp/moeserve-mm make-model --arch qwen3moe --preset 30b-a3b --type $m \
        --quick-quant --no-progress -o $f > /tmp/make_$m.log 2>&1 && touch $f.done;"
    done
    [ -z "$cmds" ] || setsid nohup sh -c "$cmds" > /dev/null 2>&1 < /dev/null &
    echo "models started $(date +%T): $mixes";;
  bench)
    nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
    for m in $mixes; do
      f=$(file_of "$m")
      for i in $(seq 1 ${MODEL_WAIT_STEPS:-120}); do [ -f "$f.done" ] && break; sleep 5; done
      [ -f "$f.done" ] || { echo "$m: model not ready: $(tail -c 300 /tmp/make_$m.log)"; continue; }
      echo "## $m: $(ls -la "$f" | awk '{printf "%.2f GiB", $5 / 2^30}'), $(grep -m1 -o 'in [0-9.]* s' /tmp/make_$m.log)"
      $bin bench -m "$f" -p 512 -n 128 -r 2 --device cuda 2>&1 | grep -E ' (pp|tg)[0-9]+ +\||roofline' | sed "s/^/moeserve gpu: /"
      scripts/device/llamacpp_gpu.sh bench "$f" -p 512 -n 128 -r 2 -ngl 99 -fa 1 2>&1 | grep -E ' (pp|tg)[0-9]+ +\|' |
        sed "s/^/llama-bench gpu: /"
      [ "${CPU_MOE:-1}" = 0 ] && continue
      $bin bench -m "$f" -p 512 -n 128 -r 2 --device cuda --cpu-moe 2>&1 | grep -E ' (pp|tg)[0-9]+ +\|' |
        sed "s/^/moeserve --cpu-moe: /"
      scripts/device/llamacpp_gpu.sh bench "$f" -p 512 -n 128 -r 2 -ngl 99 -fa 1 -ncmoe 99 2>&1 |
        grep -E ' (pp|tg)[0-9]+ +\|' | sed "s/^/llama-bench -ncmoe 99: /"
    done 2>&1 | tee "$out/lowbit_30b.txt";;
  *)
    awk 'NR > 1 { if (!/^#/) exit; print }' "$0"
    exit 2;;
esac
