#!/usr/bin/env bash
# bench/server/host_tier_passes.sh (from the repository root, after building build-dev): the paged
# KV host tier against none, on make-model --preset small --quick-quant.
# Two passes of the same requests against one server: the second finds the
# first pass's prompts evicted from a small pool, in the host tier or not.
bin=build-dev/bin/moeserve
m=${MODEL:-/work/bench_models/small-q4km-quick.gguf}  # make-model --preset small --type q4_k_m --quick-quant
for extra in "--kv-host-mem 0" ""; do
  log=/tmp/serve_ht.log
  $bin serve -m $m --port 0 --threads 2 --parallel 4 --ctx-size 1024 --kv-mem 48M $extra > $log 2>&1 &
  pid=$!
  for i in $(seq 1 300); do grep -q "ready at" $log && break; sleep 0.2; done
  url=$(sed -n 's#.*ready at \(http://[^/ ]*\)/.*#\1#p' $log | head -1)
  echo "### --kv-mem 48M $extra"
  for pass in 1 2; do
    node bench/server/load_gen.mjs --url $url --workload sharegpt --clients 4 --requests 12 --input 120:200 \
      --output 8:16 --seed 5 2>&1 | sed -n '/^requests:/p;/^request throughput/p;/^| TTFT/p;/^server KV/p' | sed "s/^/pass $pass: /"
  done
  kill $pid; wait $pid 2>/dev/null
done
