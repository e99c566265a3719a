#!/usr/bin/env bash
# Layer split (issue 41) on the device machine:
#   scripts/device/split.sh start   # build, start making the 30b-a3b file, GPU tests (kernels, models, split,
#                                   # shard processes with a cuda parent, runtime, spec), tiny-model split benches
#   scripts/device/split.sh bench   # wait for the file, then the CPU alone, unsplit vs cuda:0,cuda:0 vs
#                                   # cuda:0+cpu (36:12) vs cuda:0+proc:cpu (36:12): pp512, pp4096, tg128
#   scripts/device/split.sh hybrid  # rebuild, split + shard tests, then --n-cpu-moe 24 unsplit vs cuda:0,cuda:0
#   scripts/device/split.sh proc_gpu # shard processes on the GPU (proc:cuda:0): the unsplit text, a tiny bench
#   scripts/device/split.sh two_gpu  # two GPUs (nvidia-h200-x2): the unsplit text, 30b unsplit vs cuda:0,cuda:1
#   scripts/device/split.sh pipeline # rebuild, split tests, then 30b pp4096 split over GPU + CPU (36:12, 47:1) and
#                                   # GPU + proc:cpu, --micro-batches 1 vs 4
set -uo pipefail
cd "$(dirname "$0")/../.."
export LD_LIBRARY_PATH=/tmp/devroot/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
out=${OUT:-/tmp/out}
mkdir -p "$out"
bin=build-gpu/bin/moeserve
m30=/tmp/30b-skew0.gguf
run_test() {  # name binary [filter]
  MOESERVE_TEST_DEVICE=cuda "$2" ${3:+--gtest_filter=$3} > "$out/$1.log" 2>&1
  echo "$1 (cuda): $(grep -E '^\[  (PASSED|FAILED)' "$out/$1.log" | tr '\n' ' ')"
  grep -E '^\[  FAILED|Failure' -A6 "$out/$1.log" | head -30
}
case "${1:-start}" in
  start)
    nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
    scripts/device/build.sh build-gpu 90a moeserve test_split test_ipc test_kernels_gpu test_models test_runtime \
      test_spec test_server > "$out/build.log" 2>&1 || { grep -E 'error|FAILED' -A3 "$out/build.log" | head -40; exit 1; }
    cp "$bin" /tmp/moeserve-mm
    if [ ! -f "$m30.done" ] && ! pgrep -f moeserve-mm >/dev/null; then
      setsid nohup sh -c "/tmp/moeserve-mm make-model --arch qwen3moe --preset 30b-a3b --type q4_k_m --quick-quant \
        --router-skew 0 -o $m30 && touch $m30.done" > /tmp/make30.log 2>&1 < /dev/null &
    fi
    run_test kernels_gpu build-gpu/tests/kernels_gpu/test_kernels_gpu
    run_test models build-gpu/tests/models/test_models '*Gpu*:Placement*:ExpertSplit*'
    run_test split build-gpu/tests/split/test_split
    run_test ipc build-gpu/tests/ipc/test_ipc 'Shard*:*ShardProcess*:Gpu*'
    run_test runtime build-gpu/tests/runtime/test_runtime
    run_test spec build-gpu/tests/spec/test_spec
    run_test server build-gpu/tests/server/test_server
    for split in "" "--layer-split cuda:0,cuda:0" "--layer-split cuda:0=0:3,cpu=3:4" "--layer-split cuda:0=0:3,proc:cpu=3:4"; do
      echo "== qwen3moe tiny ${split:-unsplit}"
      $bin bench -m tests/data/models/qwen3moe-tiny.bf16.gguf -p 64 -n 128 -r 3 ${split:---device cuda} 2>&1 \
        | grep -E 'pp64|tg128|error'
    done;;
  bench)
    for i in $(seq 1 100); do [ -f "$m30.done" ] && break; sleep 5; done
    [ -f "$m30.done" ] || { echo "model not ready: $(tail -c 300 /tmp/make30.log)"; exit 1; }
    echo "== 30b-a3b Q4_K_M --device cpu (the CPU shard's own speed, for its share)"
    $bin bench -m $m30 -p 512 -n 128 -r 1 --device cpu 2>&1 | tee "$out/bench30_cpu.txt" | grep -E '\| pp[0-9]+|\| tg128|error'
    for split in "--device cuda" "--layer-split cuda:0,cuda:0" "--layer-split cuda:0=0:36,cpu=36:48" \
                 "--layer-split cuda:0=0:36,proc:cpu=36:48"; do
      echo "== 30b-a3b Q4_K_M $split"
      $bin bench -m $m30 -p 512 -n 128 -r ${REPS:-2} $split 2>&1 | tee "$out/bench30_${split//[ :=,]/_}.txt" \
        | grep -E '\| pp[0-9]+|\| tg128|error|first token'
      $bin bench -m $m30 -p 4096 -n 0 -r 1 $split 2>&1 | tee -a "$out/bench30_${split//[ :=,]/_}.txt" \
        | grep -E '\| pp[0-9]+|error'
    done;;
  hybrid)
    # The split with cold experts on the CPU (--n-cpu-moe) against one GPU with the same placement;
    # then the split and shard tests again (the hybrid test on the GPU).
    scripts/device/build.sh build-gpu 90a moeserve test_split test_ipc > "$out/build.log" 2>&1 \
      || { grep -E 'error|FAILED' -A3 "$out/build.log" | head -40; exit 1; }
    if [ ! -f "$m30.done" ] && ! pgrep -f moeserve-mm >/dev/null; then
      cp "$bin" /tmp/moeserve-mm
      setsid nohup sh -c "/tmp/moeserve-mm make-model --arch qwen3moe --preset 30b-a3b --type q4_k_m --quick-quant \
        --router-skew 0 -o $m30 && touch $m30.done" > /tmp/make30.log 2>&1 < /dev/null &
    fi
    run_test split build-gpu/tests/split/test_split
    run_test ipc build-gpu/tests/ipc/test_ipc 'Shard*:*ShardProcess*'
    for i in $(seq 1 100); do [ -f "$m30.done" ] && break; sleep 5; done
    [ -f "$m30.done" ] || { echo "model not ready: $(tail -c 300 /tmp/make30.log)"; exit 1; }
    for split in "--device cuda" "--layer-split cuda:0,cuda:0"; do
      echo "== 30b-a3b Q4_K_M $split --n-cpu-moe 24"
      $bin bench -m $m30 -p 512 -n 128 -r ${REPS:-2} $split --n-cpu-moe 24 2>&1 \
        | tee "$out/bench30_hybrid_${split//[ :=,]/_}.txt" | grep -E '\| pp[0-9]+|\| tg128|error'
    done;;
  proc_gpu)
    # Shard processes on the GPU (proc:cuda:0) beside this process's GPU layers: the unsplit text.
    scripts/device/build.sh build-gpu 90a moeserve > "$out/build.log" 2>&1 \
      || { grep -E 'error|FAILED' -A3 "$out/build.log" | head -40; exit 1; }
    for arch in qwen3moe qwen35moe laguna; do
      m=tests/data/models/$arch-tiny.bf16.gguf
      want=$($bin generate -m $m -p 'def add(a, b):' -n 32 --temp 0 --device cuda 2>/dev/null | md5sum)
      for split in cuda:0=0:2,proc:cuda:0=2:4 proc:cuda:0=0:2,cuda:0=2:4 proc:cuda:0=0:1,cpu=1:3,proc:cuda:0=3:4; do
        got=$($bin generate -m $m -p 'def add(a, b):' -n 32 --temp 0 --layer-split $split 2>"$out/err_$arch.txt" | md5sum)
        [ "$got" = "$want" ] && echo "$arch $split: same text" || { echo "$arch $split: DIFFERENT"; tail -3 "$out/err_$arch.txt"; }
      done
    done
    $bin bench -m tests/data/models/qwen3moe-tiny.bf16.gguf -p 64 -n 128 -r 3 --layer-split cuda:0=0:2,proc:cuda:0=2:4 \
      2>&1 | grep -E '\| pp64|\| tg128|error';;
  two_gpu)
    # Two GPUs (kind nvidia-h200-x2): the rows cross by peer copy. The unsplit text on the tiny models,
    # then the 30b-a3b file unsplit vs cuda:0,cuda:1.
    nvidia-smi --query-gpu=name --format=csv,noheader
    scripts/device/build.sh build-gpu 90a moeserve > "$out/build.log" 2>&1 \
      || { grep -E 'error|FAILED' -A3 "$out/build.log" | head -40; exit 1; }
    if [ ! -f "$m30.done" ] && ! pgrep -f moeserve-mm >/dev/null; then
      cp "$bin" /tmp/moeserve-mm
      setsid nohup sh -c "/tmp/moeserve-mm make-model --arch qwen3moe --preset 30b-a3b --type q4_k_m --quick-quant \
        --router-skew 0 -o $m30 && touch $m30.done" > /tmp/make30.log 2>&1 < /dev/null &
    fi
    for arch in qwen3 qwen3moe qwen35moe laguna; do
      m=tests/data/models/$arch-tiny.bf16.gguf
      want=$($bin generate -m $m -p 'def add(a, b):' -n 32 --temp 0 --device cuda 2>/dev/null | md5sum)
      for split in cuda:0,cuda:1 cuda:0=0:1,cuda:1=1:3,cuda:0=3:4 cuda:1=0:2,proc:cuda:0=2:4; do
        got=$($bin generate -m $m -p 'def add(a, b):' -n 32 --temp 0 --layer-split $split 2>"$out/err_$arch.txt" | md5sum)
        [ "$got" = "$want" ] && echo "$arch $split: same text" || { echo "$arch $split: DIFFERENT"; tail -3 "$out/err_$arch.txt"; }
      done
    done
    for i in $(seq 1 100); do [ -f "$m30.done" ] && break; sleep 5; done
    [ -f "$m30.done" ] || { echo "model not ready: $(tail -c 300 /tmp/make30.log)"; exit 1; }
    for split in "--device cuda" "--layer-split cuda:0,cuda:1"; do
      echo "== 30b-a3b Q4_K_M $split"
      $bin bench -m $m30 -p 512 -n 128 -r 2 $split 2>&1 | tee "$out/bench30_2gpu_${split//[ :=,]/_}.txt" \
        | grep -E '\| pp[0-9]+|\| tg128|error'
      $bin bench -m $m30 -p 4096 -n 0 -r 1 $split 2>&1 | grep -E '\| pp[0-9]+|error'
    done;;
  pipeline)
    scripts/device/build.sh build-gpu 90a moeserve test_split > "$out/build.log" 2>&1 \
      || { grep -E 'error|FAILED' -A3 "$out/build.log" | head -40; exit 1; }
    if [ ! -f "$m30.done" ] && ! pgrep -f moeserve-mm >/dev/null; then
      cp "$bin" /tmp/moeserve-mm
      setsid nohup sh -c "/tmp/moeserve-mm make-model --arch qwen3moe --preset 30b-a3b --type q4_k_m --quick-quant \
        --router-skew 0 -o $m30 && touch $m30.done" > /tmp/make30.log 2>&1 < /dev/null &
    fi
    run_test split build-gpu/tests/split/test_split
    for i in $(seq 1 100); do [ -f "$m30.done" ] && break; sleep 5; done
    [ -f "$m30.done" ] || { echo "model not ready: $(tail -c 300 /tmp/make30.log)"; exit 1; }
    for split in ${SPLITS:-cuda:0=0:36,cpu=36:48 cuda:0=0:47,cpu=47:48 cuda:0=0:36,proc:cpu=36:48}; do
      for micro in 1 4; do
        echo "== 30b-a3b Q4_K_M --layer-split $split --micro-batches $micro"
        $bin bench -m $m30 -p ${PP:-4096} -n 0 -r 1 --layer-split $split --micro-batches $micro 2>&1 \
          | tee "$out/bench30_pipe_${split//[ :=,]/_}_$micro.txt" | grep -E '\| pp[0-9]+|error'
      done
    done;;
esac
