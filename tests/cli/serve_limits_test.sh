#!/usr/bin/env bash
# moeserve serve start-up limits (issue 17), end to end:
#  - --queue 100000 starts with a bounded number of threads and answers;
#  - a KV cache that cannot fit the address-space limit is refused with
#    the bytes and the flags, exit 1 (no abort, no "listening" then a crash);
#  - the special-token policy flag rejects unknown values;
#  - --chat-template refuses a template that does not parse, naming the line.
# usage: serve_limits_test.sh MOESERVE MODEL
set -uo pipefail
bin=$1
model=$2
fail() { echo "FAIL: $*"; exit 1; }

port_file=$(mktemp)
log=$(mktemp)
trap 'rm -f "$port_file" "$log"; [ -n "${pid:-}" ] && kill "$pid" 2>/dev/null' EXIT

# 1. A huge queue: bounded threads, the server answers.
"$bin" serve -m "$model" --queue 100000 --port 0 --threads 2 > "$log" 2>&1 &
pid=$!
for _ in $(seq 1 100); do grep -q "ready at" "$log" && break; sleep 0.1; done
grep -q "ready at" "$log" || fail "no ready line: $(cat "$log")"
grep -q "serving at most [0-9]* connections" "$log" || fail "no connection-cap note: $(cat "$log")"
# The event-loop front end: connections and the queue cost no thread (the
# engine's, the compute pool's and --parallel + 8 handler threads remain).
threads=$(ls /proc/$pid/task | wc -l)
[ "$threads" -le 64 ] || fail "$threads threads with --queue 100000"
port=$(sed -n 's#.*ready at http://[^:]*:\([0-9]*\)/.*#\1#p' "$log" | head -1)
if command -v curl > /dev/null; then
  curl -sf "http://127.0.0.1:$port/health" > /dev/null || fail "no answer on /health"
fi
kill "$pid"; wait "$pid" 2>/dev/null; pid=

# 2. Too little address space for the KV cache: a clear refusal, exit 1.
out=$( (ulimit -v 3000000; "$bin" serve -m "$model" --ctx-size 1048576 --parallel 8 --port 0 --threads 2) 2>&1)
code=$?
[ "$code" -eq 1 ] || fail "exit $code (want 1): $out"
echo "$out" | grep -q "not enough memory: the KV cache for --parallel 8 x --ctx-size 1048576" \
  || fail "no memory-plan message: $out"
echo "$out" | grep -q "terminate called" && fail "aborted: $out"

# 3. The special-token policy takes text or parse only.
"$bin" serve -m "$model" --special-tokens-in-content maybe --port 0 > "$log" 2>&1 && fail "accepted 'maybe'"
grep -q "special-tokens-in-content" "$log" || fail "no message naming the flag: $(cat "$log")"

# 4. --chat-template: a template that does not parse is refused at start,
#    naming the file and the line; a missing file likewise (issue 19).
tmpl=$(mktemp --suffix=.jinja)
printf '{%% for m in messages %%}{{ m.content }}\n{%% endfor %%' > "$tmpl"
out=$("$bin" serve -m "$model" --chat-template "$tmpl" --port 0 2>&1)
code=$?
rm -f "$tmpl"
[ "$code" -eq 1 ] || fail "bad template: exit $code: $out"
echo "$out" | grep -q -- "--chat-template $tmpl: chat template line 2" || fail "no file and line: $out"
echo "$out" | grep -q "listening" && fail "started listening with a bad template: $out"
out=$("$bin" serve -m "$model" --chat-template /nonexistent/t.jinja --port 0 2>&1) && fail "accepted a missing file"
echo "$out" | grep -q "cannot open" || fail "no message for a missing file: $out"
# 5. Paged KV (issue 42): a pool too small for one block, or a block size
#    that is not a power of two, is refused at start; a pool serves 64
#    slots and /metrics counts its blocks.
out=$("$bin" serve -m "$model" --kv-mem 1K --port 0 --threads 2 2>&1) && fail "accepted --kv-mem 1K"
echo "$out" | grep -q -- "give --kv-mem at least" || fail "no message for a tiny pool: $out"
echo "$out" | grep -q "terminate called" && fail "aborted: $out"
out=$("$bin" serve -m "$model" --kv-mem 64M --kv-block 24 --port 0 --threads 2 2>&1) && fail "accepted --kv-block 24"
echo "$out" | grep -q "power of two" || fail "no message for --kv-block 24: $out"
out=$("$bin" serve -m "$model" --kv-host-mem 1G --port 0 --threads 2 2>&1) && fail "accepted --kv-host-mem alone"
echo "$out" | grep -q -- "--kv-host-mem needs --kv-mem" || fail "no message for --kv-host-mem alone: $out"
"$bin" serve -m "$model" --kv-mem 16M --kv-block 16 --kv-host-mem 64M --parallel 64 --ctx-size 2048 --port 0 \
  --threads 2 > "$log" 2>&1 &
pid=$!
for _ in $(seq 1 100); do grep -q "ready at" "$log" && break; sleep 0.1; done
grep -q "ready at" "$log" || fail "no ready line with --kv-mem: $(cat "$log")"
grep -q "paged KV: [0-9]* blocks of 16 positions" "$log" || fail "no paged-KV line: $(cat "$log")"
port=$(sed -n 's#.*ready at http://[^:]*:\([0-9]*\)/.*#\1#p' "$log" | head -1)
if command -v curl > /dev/null; then
  reply=$(curl -sf "http://127.0.0.1:$port/v1/completions" -H 'content-type: application/json' \
    -d '{"prompt": "def main(", "max_tokens": 8, "temperature": 0}') || fail "no completion with --kv-mem"
  echo "$reply" | grep -q '"completion_tokens"' || fail "no usage in $reply"
  metrics=$(curl -sf "http://127.0.0.1:$port/metrics") || fail "no /metrics"
  echo "$metrics" | grep -q "^moeserve_kv_blocks_total [1-9]" || fail "no block count in /metrics"
  echo "$metrics" | grep -q "^moeserve_kv_blocks_free [1-9]" || fail "no free blocks in /metrics"
  echo "$metrics" | grep -q "^moeserve_kv_host_blocks 0" || fail "no host tier gauge in /metrics"
fi
kill "$pid"; wait "$pid" 2>/dev/null; pid=
echo "serve limits: ok"
