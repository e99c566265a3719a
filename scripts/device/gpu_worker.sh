#!/usr/bin/env bash
# The expert worker with a GPU parent (issues 18 and 22) on the device machine.
#   scripts/device/gpu_worker.sh tests
#       build; the worker tests with MOESERVE_TEST_DEVICE=cuda (a GPU worker
#       on the parent's own GPU is enough for them)
#   scripts/device/gpu_worker.sh kill [WORKER_DEVICE]    (only the kill -9 test of bench)
#   scripts/device/gpu_worker.sh bench [WORKER_DEVICE]   (default cuda:1 when there are two GPUs, else cpu)
#       make-model 30b-a3b q4_k_m (quick quant); greedy output and prompt
#       4096 / 128 generated for: everything on GPU 0; --n-cpu-moe 24 (the
#       cold experts on this process's CPU threads); the same cold experts
#       in a spawned worker on WORKER_DEVICE, batched and stream, with the
#       cost model's expert copies for prefill and without; kill -9 of the
#       worker mid-generation. CPU_WORKER=1 adds a CPU worker process, ALL_GPU=1
#       the bench with every expert on GPU 0.
# Logs go to $OUT, a summary to stdout. NCPU (default 24) sets --n-cpu-moe.
set -uo pipefail
cd "$(dirname "$0")/../.."
export LD_LIBRARY_PATH=/tmp/devroot/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
out=${OUT:-/tmp/out}
mkdir -p "$out"
bin=build-gpu/bin/moeserve
scripts/device/build.sh build-gpu 90a moeserve test_ipc > "$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
n_gpus=$(nvidia-smi -L | wc -l)
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader
wd=${2:-$([ "$n_gpus" -ge 2 ] && echo cuda:1 || echo cpu)}
ncpu=${NCPU:-24}
model=/tmp/30b-a3b.q4_k_m.quick.gguf
prompt="Write a short story about a lighthouse keeper who finds a message in a bottle. The story should"
gen() { local n=$1; shift; timeout 300 $bin generate -m $model --device cuda:0 -p "$prompt" -n $n --temp 0 "$@"; }
make_model() {
  for i in $(seq 1 120); do pgrep -f moeserve-mm > /dev/null || break; sleep 2; done
  [ -f $model ] || { time $bin make-model --arch qwen3moe --preset 30b-a3b --type q4_k_m --quick-quant -o $model \
    > "$out/make.log" 2>&1; } 2>&1 | grep real
}
kill_test() {  # kill -9 of the worker in the middle of a generation
  # The synthetic model's text may be a few bytes only: the trigger is the
  # end of the load (the pinning line), then a second of the 400 tokens.
  rm -f "$out/g_kill.err"
  ( for i in $(seq 1 1200); do grep -q "file pinned" "$out/g_kill.err" 2>/dev/null && break; sleep 0.1; done
    sleep 1
    pkill -9 -f "moeserve worker --experts" && echo "killed the worker 1 s into the generation" ) &
  gen 400 --n-cpu-moe $ncpu --expert-worker spawn --expert-worker-device $wd > /tmp/g_kill.txt 2> "$out/g_kill.err"
  wait
  gen 400 --n-cpu-moe $ncpu --expert-worker spawn --expert-worker-device $wd > /tmp/g_wfull.txt 2> /dev/null
  [ -s /tmp/g_kill.txt ] || echo "killed worker: no output: $(tail -2 "$out/g_kill.err")"
  # Before the kill the worker computed the cold experts, after it this
  # process's CPU threads: equal to the worker's run up to where they round apart.
  if cmp -s /tmp/g_wfull.txt /tmp/g_kill.txt; then echo "killed worker: output == the worker's uninterrupted run (400 tokens)"; else
    echo "killed worker: output differs from the uninterrupted run: $(cmp /tmp/g_wfull.txt /tmp/g_kill.txt | head -1)"; fi
  grep -hE "^prompt:" "$out/g_kill.err"
  grep -hE "lost|back in use|expert worker:" "$out/g_kill.err" | head -4
}
case "${1:-tests}" in
  tests)
    model=/tmp/30b-a3b.q4_k_m.quick.gguf  # for a bench call that follows: made meanwhile
    if [ -n "${MAKE_MODEL:-}" ] && [ ! -f $model ]; then
      cp $bin /tmp/moeserve-mm
      setsid nohup sh -c "/tmp/moeserve-mm make-model --arch qwen3moe --preset 30b-a3b --type q4_k_m --quick-quant \
        -o $model.part && mv $model.part $model" > /tmp/make30.log 2>&1 < /dev/null &
    fi
    MOESERVE_TEST_DEVICE=cuda build-gpu/tests/ipc/test_ipc --gtest_filter='GpuWorker*' > "$out/gpu_worker_tests.log" 2>&1
    echo "gpu worker tests: $(grep -E '^\[  (PASSED|FAILED)' "$out/gpu_worker_tests.log" | tr '\n' ' ')"
    grep -E '^\[  FAILED|Failure|Expected|Which is|max \|' "$out/gpu_worker_tests.log" | head -20
    build-gpu/tests/ipc/test_ipc > "$out/ipc_tests.log" 2>&1
    echo "ipc tests (cpu): $(grep -E '^\[  (PASSED|FAILED)' "$out/ipc_tests.log" | tr '\n' ' ')";;
  kill)
    make_model
    kill_test;;
  bench)
    make_model
    gen 96 > /tmp/g_gpu.txt 2> "$out/g_gpu.err"
    gen 96 --n-cpu-moe $ncpu > /tmp/g_cpu.txt 2> "$out/g_cpu.err"
    gen 96 --n-cpu-moe $ncpu --expert-worker spawn --expert-worker-device $wd > /tmp/g_w.txt 2> "$out/g_w.err"
    for v in cpu w; do
      if cmp -s /tmp/g_gpu.txt /tmp/g_$v.txt; then echo "greedy all-GPU == $v"; else
        echo "greedy all-GPU != $v: $(cmp /tmp/g_gpu.txt /tmp/g_$v.txt | head -1)"; fi
    done
    grep -hE "^experts|expert worker" "$out/g_w.err" | head -3
    kill_test
    b() { echo "== $1"; shift; timeout 400 $bin bench -m $model --device cuda:0 -p 4096 -n 128 -r 1 -b 4096 "$@" 2>&1 \
      | tee -a "$out/bench.txt" | grep -E "pp4096|tg128|^pp:|^tg:|error|roofline"; }
    [ -n "${ALL_GPU:-}" ] && b "all experts on GPU 0"
    b "--n-cpu-moe $ncpu: cold experts on this process's CPU threads" --n-cpu-moe $ncpu
    for v in auto:batched never:batched never:stream; do
      MOESERVE_EXPERT_COPIES=${v%:*} b "--n-cpu-moe $ncpu, cold experts in a worker on $wd, ${v#*:}, expert copies ${v%:*}" \
        --n-cpu-moe $ncpu --expert-worker spawn --expert-worker-device $wd --expert-mode ${v#*:}
    done
    [ -n "${CPU_WORKER:-}" ] && b "--n-cpu-moe $ncpu, cold experts in a CPU worker process, batched" --n-cpu-moe $ncpu \
      --expert-worker spawn --expert-mode batched;;
esac
