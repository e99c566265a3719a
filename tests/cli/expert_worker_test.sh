#!/usr/bin/env bash
# The expert worker process (issue 18), end to end through the CLI:
#  - `generate --expert-worker spawn` prints the same greedy text as
#    in-process compute, with both transports and both modes, for every
#    expert on the worker and for a placement that gives it half of them;
#  - `serve --expert-worker spawn` answers concurrent streams with the same
#    text as a server without a worker; after kill -9 of its worker the
#    answers stay the same and /metrics shows the failure and the restart;
#  - errors say what to do: a worker that is not there with
#    --expert-worker-required, --expert-worker-required alone, a model
#    without experts, a socket directory open to others, a GPU that is not there, a
#    worker whose kernels or weight layout differ from the parent's.
# usage: expert_worker_test.sh MOESERVE MODEL OTHER_MODEL WORKDIR
set -uo pipefail
bin=$1
model=$2
other=$3
work=$4
fail() { echo "FAIL: $*"; exit 1; }
rm -rf "$work"
mkdir -p "$work"
chmod 700 "$work"
pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done' EXIT

# 1. generate: the same text in every transport and mode.
prompt='def fibonacci(n):
    """Return the n-th Fibonacci number."""
    if n < 2:
        return n'
gen() { "$bin" generate -m "$model" --device cpu -p "$prompt" -n 40 --temp 0 -t 2 -b 8 "$@" 2> "$work/gen.err"; }
want=$(gen) || fail "generate: $(cat "$work/gen.err")"
[ -n "$want" ] || fail "generate printed nothing"
# A placement giving the worker the even experts of even layers, the odd ones of odd layers.
"$bin" place -m "$model" --gpu-mem 1GiB --reserve 0 -o "$work/base.json" > /dev/null 2>&1 || fail "place failed"
python3 - "$work/base.json" "$work/half.json" <<'EOF' || fail "could not write the half placement"
import json, sys
p = json.load(open(sys.argv[1]))
n_expert = p["model"]["n_expert"]
p["layers"] = [{"layer": l, "hot": [], "worker": list(range(l % 2, n_expert, 2))} for l in range(p["model"]["n_layer"])]
json.dump(p, open(sys.argv[2], "w"))
EOF
for placement in "" "$work/half.json"; do
  for transport in stream shm; do
    for mode in batched stream; do
      args=(--expert-worker spawn --expert-transport "$transport" --expert-mode "$mode")
      [ -n "$placement" ] && args+=(--placement "$placement")
      got=$(gen "${args[@]}") || fail "generate ${args[*]}: $(cat "$work/gen.err")"
      [ "$got" == "$want" ] || fail "generate ${args[*]} printed another text:
$got
--- in process:
$want"
      grep -q "expert worker: [1-9][0-9]* calls" "$work/gen.err" || fail "no worker metrics line: $(cat "$work/gen.err")"
      grep -q "0 computed here (fallbacks)" "$work/gen.err" || fail "fallbacks without a failure: $(cat "$work/gen.err")"
      if [ "$mode" == stream ]; then
        grep -q "batches ([1-9][0-9]* streamed)" "$work/gen.err" || fail "stream mode streamed nothing: $(cat "$work/gen.err")"
      fi
    done
  done
done

# 2. serve: concurrent streams, then kill -9 of the worker.
start_server() {  # LOG ARGS...
  local log=$1
  shift
  "$bin" serve -m "$model" --device cpu --port 0 --threads 2 --parallel 3 "$@" > "$log" 2>&1 &
  server_pid=$!
  pids+=("$server_pid")
  for _ in $(seq 1 600); do grep -q "ready at" "$log" && break; sleep 0.1; done
  grep -q "ready at" "$log" || fail "serve $*: no ready line: $(cat "$log")"
  port=$(sed -n 's#.*ready at http://[^:]*:\([0-9]*\)/.*#\1#p' "$log" | head -1)
}
complete() {  # PORT N OUT
  curl -sf "http://127.0.0.1:$1/v1/completions" -H 'Content-Type: application/json' \
    -d "{\"prompt\": \"def f$2(x):\\n    return\", \"max_tokens\": 24, \"temperature\": 0, \"stream\": true}" \
    | grep '^data: {' | python3 -c 'import json,sys; print("".join(json.loads(l[6:])["choices"][0]["text"] for l in sys.stdin))' > "$3"
}
concurrent() {  # PORT PREFIX
  local p=()
  for n in 1 2 3; do
    complete "$1" "$n" "$work/$2.$n" &
    p+=($!)
  done
  for x in "${p[@]}"; do wait "$x" || fail "a request to port $1 failed"; done
}
metric() { curl -sf "http://127.0.0.1:$1/metrics" | sed -n "s/^moeserve_expert_worker_$2 //p"; }

start_server "$work/ref.log"
ref_port=$port
concurrent "$ref_port" ref
start_server "$work/worker.log" --expert-worker spawn
concurrent "$port" worker
for n in 1 2 3; do
  [ -s "$work/ref.$n" ] || fail "empty answer $n"
  cmp -s "$work/ref.$n" "$work/worker.$n" || fail "request $n: the worker's answer differs: $(cat "$work/worker.$n") vs $(cat "$work/ref.$n")"
done
calls=$(metric "$port" calls_total)
[ "${calls%%.*}" -gt 0 ] 2>/dev/null || fail "/metrics: no worker calls ($calls)"
worker_pid=$(pgrep -P "$server_pid" | head -1)
[ -n "$worker_pid" ] || fail "no worker process under the server"
# Killed while three streams run: their text does not change.
p=()
for n in 1 2 3; do
  complete "$port" "$n" "$work/killed.$n" &
  p+=($!)
done
sleep 0.2
kill -9 "$worker_pid"
for x in "${p[@]}"; do wait "$x" || fail "a request failed after kill -9 of the worker"; done
for n in 1 2 3; do
  cmp -s "$work/ref.$n" "$work/killed.$n" || fail "request $n after kill -9 differs: $(cat "$work/killed.$n")"
done
# The loss is seen (by a call or the health check) and the worker restarted.
for _ in $(seq 1 600); do
  restarts=$(metric "$port" restarts_total)
  [ "${restarts%%.*}" -ge 1 ] 2>/dev/null && break
  sleep 0.1
done
[ "${restarts%%.*}" -ge 1 ] 2>/dev/null || fail "/metrics: no restart after kill -9 ($(curl -s "http://127.0.0.1:$port/metrics" | grep expert_worker))"
failures=$(metric "$port" failures_total)
[ "${failures%%.*}" -ge 1 ] || fail "/metrics: the failure is not counted"
[ "$(metric "$port" up)" == 1 ] || fail "/metrics: the worker is not back up"
new_pid=$(pgrep -P "$server_pid" | head -1)
[ -n "$new_pid" ] && [ "$new_pid" != "$worker_pid" ] || fail "no new worker process"
concurrent "$port" again
for n in 1 2 3; do cmp -s "$work/ref.$n" "$work/again.$n" || fail "request $n after the restart differs"; done
kill "$server_pid"
wait "$server_pid" 2>/dev/null

# 3. Errors that say what to do.
out=$("$bin" generate -m "$model" --device cpu -p hi -n 2 --expert-worker "unix:$work/none.sock" --expert-worker-required \
  --expert-worker-timeout 300 2>&1) && fail "a missing required worker was accepted"
echo "$out" | grep -q -- "--expert-worker-required" || fail "no flag named: $out"
out=$("$bin" generate -m "$model" --device cpu -p hi -n 2 --expert-worker-required 2>&1) && fail "--expert-worker-required alone was accepted"
echo "$out" | grep -q "needs --expert-worker" || fail "$out"
out=$("$bin" worker --experts -m "$other" --listen "unix:$work/dense.sock" 2>&1) && fail "a model without experts was served"
echo "$out" | grep -q "no stacked experts" || fail "$out"
out=$("$bin" worker --experts -m "$model" --device cuda:99 --listen "unix:$work/x.sock" 2>&1) && fail "--device cuda:99 accepted"
echo "$out" | grep -qE "use --device cpu|only [0-9]+ GPU" || fail "$out"
mkdir -p "$work/open"
chmod 755 "$work/open"
out=$("$bin" worker --experts -m "$model" --listen "unix:$work/open/w.sock" 2>&1) && fail "an open directory was accepted"
echo "$out" | grep -q "mkdir -m 700" || fail "$out"
out=$("$bin" worker -m "$model" --listen "unix:$work/w.sock" 2>&1) && fail "a worker without --experts was accepted"
echo "$out" | grep -q -- "--experts" || fail "$out"
# A worker that computes otherwise (packed weights, the parent --no-pack):
# the parent is refused at the handshake, naming the mismatch.
"$bin" worker --experts -m "$model" --listen "unix:$work/w.sock" > "$work/w.log" 2>&1 &
pids+=($!)
out=$("$bin" generate -m "$model" --device cpu --no-pack -p hi -n 2 --expert-worker "unix:$work/w.sock" --expert-worker-required 2>&1) \
  && fail "a worker with other kernels or layout was accepted"
echo "$out" | grep -q "kernel mismatch" || fail "$out"
echo "ok"
