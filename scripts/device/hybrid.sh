#!/usr/bin/env bash
# Experts shared between the GPU and the CPU (issue 20) on the device machine:
#   scripts/device/hybrid.sh start   # build, start making the 30b-a3b files (skews 0.5 and 0), GPU tests
#   scripts/device/hybrid.sh bench   # wait for the files, then pp512/tg128 per placement
# SKEWS="0.5 0" picks the files; CASES picks placements (see below); VARIANT="ENV=value"
# runs each case again with that setting (MOESERVE_EXPERT_TRACE=1 adds the host experts' timings);
# VARIANT_ARGS="--no-pin" runs each case again with those flags.
set -uo pipefail
cd "$(dirname "$0")/../.."
export LD_LIBRARY_PATH=/tmp/devroot/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
out=${OUT:-/tmp/out}
mkdir -p "$out"
bin=build-gpu/bin/moeserve
skews=${SKEWS:-0.5 0}
model_of() { echo "/tmp/30b-skew$1.gguf"; }
case "${1:-start}" in
  start)
    nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
    scripts/device/build.sh build-gpu 90a moeserve test_kernels test_kernels_gpu test_models test_moe test_runtime test_server \
      > "$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
    cp "$bin" /tmp/moeserve-mm
    if ! pgrep -f moeserve-mm >/dev/null; then
      cmds=""
      for s in $skews; do
        m=$(model_of "$s")
        [ -f "$m.done" ] || cmds="$cmds /tmp/moeserve-mm make-model --arch qwen3moe --preset 30b-a3b --type q4_k_m --quick-quant --router-skew $s -o $m && touch $m.done;"
      done
      [ -n "$cmds" ] && setsid nohup sh -c "$cmds" > /tmp/make30.log 2>&1 < /dev/null &
    fi
    # The host CPU's kernel level (AVX-512 there, AVX2 in CI) against the references.
    build-gpu/tests/kernels/test_kernels > "$out/kernels_cpu.log" 2>&1
    echo "kernels (host CPU): $(grep -E '^\[  (PASSED|FAILED)' "$out/kernels_cpu.log" | tr '\n' ' ')"
    grep -E '^\[  FAILED' "$out/kernels_cpu.log" | head
    build-gpu/tests/kernels_gpu/test_kernels_gpu > "$out/kernels.log" 2>&1
    echo "kernels_gpu: $(grep -E '^\[  (PASSED|FAILED)' "$out/kernels.log" | tr '\n' ' ')"
    grep -E '^\[  FAILED' "$out/kernels.log" | head
    build-gpu/tests/models/test_models --gtest_filter='*Gpu*:Placement*:ExpertSplit*' > "$out/models.log" 2>&1
    echo "models (gpu): $(grep -E '^\[  (PASSED|FAILED)|parity-gpu' "$out/models.log" | tr '\n' ' ')"
    for t in moe runtime server; do
      MOESERVE_TEST_DEVICE=cuda build-gpu/tests/$t/test_$t > "$out/$t.log" 2>&1
      echo "$t (cuda): $(grep -E '^\[  (PASSED|FAILED)' "$out/$t.log" | tr '\n' ' ')"
      grep -E '^\[  FAILED|Failure' -A6 "$out/$t.log" | head -30
    done
    for args in "" "--n-cpu-moe 2" "--cpu-moe"; do
      $bin generate -m tests/data/models/qwen3moe-tiny.bf16.gguf -p "def fibonacci(n):" -n 48 --temp 0 --device cuda $args \
        > "/tmp/gen_hybrid.txt" 2> /tmp/gen_hybrid.err
      echo "generate cuda $args: $(md5sum < /tmp/gen_hybrid.txt | cut -c1-8) $(grep -E 'experts|error' /tmp/gen_hybrid.err | head -2)"
    done;;
  bench)
    for s in $skews; do
      m=$(model_of "$s")
      for i in $(seq 1 100); do [ -f "$m.done" ] && break; sleep 5; done
      [ -f "$m.done" ] || { echo "model not ready: $(tail -c 300 /tmp/make30.log)"; exit 1; }
      # The VRAM of --n-cpu-moe 36 / 24 / 12 (a quarter, half, three quarters of the
      # expert bytes) as --gpu-mem budgets: dense + KV + 1 GiB reserve + that share.
      read -r q25 q50 q75 < <($bin place -m "$m" --gpu-mem 1000GiB -o /tmp/all.json | python3 -c '
import re,sys
t=sys.stdin.read()
e,d=map(float,re.search(r"([\d.]+) GiB of experts, ([\d.]+) GiB dense",t).groups())
kv=float(re.search(r"KV ([\d.]+)",t).group(1))
print(" ".join(f"{d+kv+1+e*f:.2f}GiB" for f in (0.25,0.5,0.75)))')
      half=$q50
      printf 'def main():\n    print("hello")\nThe quick brown fox\nimport numpy as np\n' > /tmp/prompts.txt
      $bin calibrate -m "$m" --prompts /tmp/prompts.txt -n 32 -o /tmp/stats$s.json --device cuda 2>&1 | tail -1
      for c in ${CASES:-gpu ncmoe24 stats50 even50 cpumoe}; do
        case $c in
          gpu) args="";; ncmoe24) args="--n-cpu-moe 24";; cpumoe) args="--cpu-moe";;
          stats50) args="--gpu-mem $half --expert-stats /tmp/stats$s.json";; even50) args="--gpu-mem $half";;
          stats25) args="--gpu-mem $q25 --expert-stats /tmp/stats$s.json";; ncmoe36) args="--n-cpu-moe 36";;
          stats75) args="--gpu-mem $q75 --expert-stats /tmp/stats$s.json";; ncmoe12) args="--n-cpu-moe 12";;
        esac
        echo "== skew $s, $c ($args)"
        $bin bench -m "$m" -p 512 -n 128 -r 2 --device cuda $args 2>&1 | tee "$out/bench_${s}_$c.txt" \
          | grep -E "experts|pp512|tg128|roofline|error|PCIe|computed on the CPU|trace"
        [ -n "${VARIANT:-}" ] && [ "$c" != gpu ] && env $VARIANT $bin bench -m "$m" -p 512 -n 128 -r 2 --device cuda $args 2>&1 \
          | grep -E "pp512|tg128|experts|trace" | sed "s/^/$VARIANT: /"
        [ -n "${VARIANT_ARGS:-}" ] && [ "$c" != gpu ] && $bin bench -m "$m" -p 512 -n 128 -r 2 --device cuda $args $VARIANT_ARGS 2>&1 \
          | grep -E "pp512|tg128|experts|staging|bound" | sed "s/^/$VARIANT_ARGS: /"
      done
    done;;
esac
