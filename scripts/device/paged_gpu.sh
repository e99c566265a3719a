#!/usr/bin/env bash
# Paged KV on the GPU (issue 42) on the device machine: its tests, then
# serving runs with and without the block pool on make-model 30b-a3b.
# Carry .devdeps for the build. The load generator needs node, which with
# the tracked files does not fit one call's 64 MiB: scripts/device/fetch_node.sh
# packs it and cuts it into .nodeparts/a and .nodeparts/b (~11 MB each), and
# two calls carry one each (`nodepart` keeps it in /tmp).
#   scripts/device/paged_gpu.sh test       # build, start make-model in the background, GPU suites ($SUITES)
#   scripts/device/paged_gpu.sh model      # make-model 30b-a3b in the foreground, if missing (build-gpu or $BIN)
#   scripts/device/paged_gpu.sh nodepart   # keep the carried .nodeparts/* in /tmp
#   scripts/device/paged_gpu.sh bench      # waits for the model; bench/server/load_gen.mjs runs
#   scripts/device/paged_gpu.sh decode     # build and model if missing; batched decode steps, contiguous
#                                          # vs paged KV (moeserve bench --parallel --kv-block)
#   scripts/device/paged_gpu.sh peer       # the same load against llama.cpp's llama-server on the same file
#       (carry .llamasrc and start `LLAMA_SERVER=1 LLAMA_TARGETS=llama-server scripts/device/llamacpp_gpu.sh
#       build` in an earlier call: it builds in the background; `nodepart`/`bench` bring node)
set -uo pipefail
cd "$(dirname "$0")/../.."
export LD_LIBRARY_PATH=/tmp/devroot/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
out=${OUT:-/tmp/out}
mkdir -p "$out"
model=/tmp/30b-a3b.q4_k_m.quick.gguf
bin=${BIN:-build-gpu/bin/moeserve}
case "${1:-}" in
  model)
    [ -f "$model.done" ] || { $bin make-model --arch qwen3moe --preset 30b-a3b --type q4_k_m --quick-quant -o $model \
      > /tmp/make30.log 2>&1 && touch $model.done; }
    ls -la $model || tail -5 /tmp/make30.log;;
  test)
    scripts/device/build.sh build-gpu 90a moeserve > "$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
    cp "$bin" /tmp/moeserve-mm
    if [ ! -f "$model.done" ]; then
      setsid nohup sh -c "/tmp/moeserve-mm make-model --arch qwen3moe --preset 30b-a3b --type q4_k_m --quick-quant \
        -o $model && touch $model.done" > /tmp/make30.log 2>&1 < /dev/null &
    fi
    SUITES=${SUITES:-"kernels_gpu models runtime"} scripts/device/gpu_tests.sh;;
  decode)
    if [ ! -f "$model.done" ]; then
      scripts/device/build.sh build-gpu 90a moeserve > "$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
      $bin make-model --arch qwen3moe --preset 30b-a3b --type q4_k_m --quick-quant -o $model > /tmp/make30.log 2>&1 \
        && touch $model.done
    fi
    for ctx in ${DECODE_CTX:-1024:8,32,64 4096:32}; do
      for kb in ${KV_BLOCKS:-0 32}; do
        echo "== context ${ctx%%:*}, --kv-block $kb"
        $bin bench -m $model -p 0 -n 64 -r 1 --device cuda --parallel ${ctx##*:} --parallel-prompt ${ctx%%:*} \
          --kv-block $kb 2>&1 | grep "decode, "
      done
    done;;
  peer)
    [ -x /tmp/node/bin/node ] || { echo "no node: run nodepart and bench first"; exit 1; }
    export PATH=/tmp/node/bin:$PATH
    peer() {  # label llama-server-args load-args...
      local label=$1 args=$2
      shift 2
      [ -z "${RUNS:-}" ] || [[ " $RUNS " == *" $label "* ]] || return 0
      echo "### $label: llama-server $args"
      SERVE_WAIT=300 scripts/device/llamacpp_gpu.sh serve $model --host 127.0.0.1 --port 18080 -ngl 99 -fa on \
        $args > "$out/$label.serve.txt" 2>&1 || { cat "$out/$label.serve.txt"; return 0; }
      node bench/server/load_gen.mjs --url http://127.0.0.1:18080 "$@" --json "$out/$label.json" \
        > "$out/$label.log" 2>&1
      sed -n '/^== /,$p' "$out/$label.log"
      kill "$(cat /tmp/llama-server.pid)" 2> /dev/null
      sleep 2
    }
    shared="--workload shared-prefix --mode closed --clients 32 --requests 96 --input 300:700 --output 64:128 --seed 1"
    peer llama_shared "-np 32 -c 131072 --cache-reuse 256" $shared
    # Issue 42's target workload: a shared system prompt at 64 concurrent clients.
    shared64="--workload shared-prefix --mode closed --clients 64 --requests 192 --input 300:700 --output 64:128 --seed 4"
    peer llama_shared64 "-np 64 -c 262144 --cache-reuse 256" $shared64
    pressure="--workload sharegpt --mode closed --clients 64 --requests 128 --input 200:500 --output 128:256 --seed 2"
    peer llama_pressure "-np 16 -c 65536 --cache-reuse 256" $pressure;;
  nodepart)
    cp .nodeparts/*/nodepart* /tmp/ && ls -la /tmp/nodepart*;;
  bench)
    [ -d .nodeparts ] && cp .nodeparts/*/nodepart* /tmp/
    if [ ! -x /tmp/node/bin/node ]; then
      mkdir -p /tmp/node/bin
      cat /tmp/nodepart0* > /tmp/node.xz
      python3 -c "
import lzma, shutil
with lzma.open('/tmp/node.xz') as src, open('/tmp/node/bin/node', 'wb') as dst: shutil.copyfileobj(src, dst)"
      chmod +x /tmp/node/bin/node
    fi
    export PATH=/tmp/node/bin:$PATH
    for i in $(seq 1 120); do [ -f "$model.done" ] && break; sleep 2; done
    [ -f "$model.done" ] || { echo "model not ready: $(tail -c 300 /tmp/make30.log)"; exit 1; }
    nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
    run() {  # label serve-args load-args...  ($RUNS: only the runs named there)
      local label=$1 serve=$2
      shift 2
      [ -z "${RUNS:-}" ] || [[ " $RUNS " == *" $label "* ]] || return 0
      echo "### $label: serve $serve"
      node bench/server/load_gen.mjs --bin $bin --model $model --serve-args="--device cuda $serve" "$@" \
        --json "$out/$label.json" > "$out/$label.log" 2>&1
      sed -n '/^== /,$p' "$out/$label.log"
    }
    shared="--workload shared-prefix --mode closed --clients 32 --requests 96 --input 300:700 --output 64:128 --seed 1"
    run shared_slots "--parallel 32 --ctx-size 4096" $shared
    run shared_paged "--parallel 32 --ctx-size 4096 --kv-mem 12G" $shared  # the slots' 32 x 4096 positions
    run shared_paged_small "--parallel 32 --ctx-size 4096 --kv-mem 2G" $shared
    shared64="--workload shared-prefix --mode closed --clients 64 --requests 192 --input 300:700 --output 64:128 --seed 4"
    run shared64_paged "--parallel 64 --ctx-size 4096 --kv-mem 24G" $shared64  # llama-server's 64 x 4096 positions
    pressure="--workload sharegpt --mode closed --clients 64 --requests 128 --input 200:500 --output 128:256 --seed 2"
    run pressure_slots "--parallel 16 --ctx-size 4096" $pressure
    run pressure_paged "--parallel 64 --ctx-size 4096 --kv-mem 6G" $pressure
    long="--workload sharegpt --mode closed --clients 8 --requests 40 --input 200:400 --output 128:256 --seed 3 \
      --long-prompt 11000 --long-at 5"
    run long_whole "--parallel 9 --ctx-size 32768 --kv-mem 8G" $long
    run long_chunk128 "--parallel 9 --ctx-size 32768 --kv-mem 8G --prefill-chunk 128" $long
    run long_chunk64 "--parallel 9 --ctx-size 32768 --kv-mem 8G --prefill-chunk 64" $long;;
  *)
    echo "usage: $0 test|model|nodepart|bench|decode|peer" >&2
    exit 2;;
esac
