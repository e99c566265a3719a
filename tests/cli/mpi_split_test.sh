#!/usr/bin/env bash
# --layer-split over MPI ranks (OpenMPI's mpirun on localhost): 2 and 3
# ranks give the unsplit greedy text on every architecture (rank 0 first,
# in the middle, or without layers of its own); serve on 2 ranks answers;
# a rank killed (-9) ends the job with an error instead of a hang; an MPI
# split outside mpirun, or with a rank left without a shard, is refused.
# Skipped (77) where mpirun is missing or moeserve was built without MPI.
#   mpi_split_test.sh MOESERVE_BIN MODELS_DIR WORK_DIR
set -u
moeserve=$1
models=$2
work=$3
rm -rf "$work"
mkdir -p "$work"
command -v mpirun > /dev/null || { echo "mpirun not found (Debian: openmpi-bin): skipped"; exit 77; }
"$moeserve" generate -m "$models/qwen3moe-tiny.bf16.gguf" -p x -n 1 --layer-split mpi:0,mpi:1 > /dev/null \
  2> "$work/outside.err"
if grep -q "built without MPI" "$work/outside.err"; then echo "moeserve built without MPI: skipped"; exit 77; fi
failures=0
fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}
grep -q "mpirun -np 2" "$work/outside.err" || fail "outside mpirun: $(cat "$work/outside.err")"
# Root may run ranks in CI; --oversubscribe: more ranks than cores.
mpi=(mpirun --oversubscribe --allow-run-as-root -x OMPI_MCA_rmaps_base_oversubscribe=1)
prompt='def add(a, b):
    return'
for arch in qwen3 qwen3moe qwen35 qwen35moe laguna; do
  model=$models/$arch-tiny.bf16.gguf
  "$moeserve" generate -m "$model" -p "$prompt" -n 24 --temp 0 -t 1 > "$work/$arch.plain" 2> "$work/$arch.err" \
    || fail "$arch plain: $(tail -3 "$work/$arch.err")"
  for run in "2 mpi:0,mpi:1" "3 mpi:0=0:1,mpi:1=1:3,mpi:2=3:4" "3 mpi:2=0:2,mpi:0=2:3,mpi:1=3:4" "2 mpi:1,cpu"; do
    np=${run%% *}
    spec=${run#* }
    timeout 120 "${mpi[@]}" -np "$np" "$moeserve" generate -m "$model" -p "$prompt" -n 24 --temp 0 -t 1 \
      --layer-split "$spec" > "$work/$arch.mpi" 2> "$work/$arch.mpi.err" \
      || fail "$arch -np $np $spec: $(tail -5 "$work/$arch.mpi.err")"
    cmp -s "$work/$arch.plain" "$work/$arch.mpi" || fail "$arch -np $np $spec changed the output"
  done
done
model=$models/qwen3moe-tiny.bf16.gguf
# A rank without a shard.
timeout 60 "${mpi[@]}" -np 3 "$moeserve" generate -m "$model" -p x -n 2 --layer-split mpi:0,mpi:1 \
  > /dev/null 2> "$work/unnamed.err" && fail "-np 3 with two shards: exit 0"
grep -q "rank 2 has no shard" "$work/unnamed.err" || fail "-np 3 with two shards: $(tail -3 "$work/unnamed.err")"
# serve on 2 ranks: a request, then rank 1 killed: the job ends (non-zero), no hang.
log=$work/serve.log
"${mpi[@]}" -np 2 "$moeserve" serve -m "$model" --port 0 -t 1 --layer-split mpi:0,mpi:1 > "$log" 2>&1 &
job=$!
for _ in $(seq 1 600); do grep -q "ready at" "$log" && break; sleep 0.1; done
port=$(sed -n 's#.*ready at http://[^:]*:\([0-9]*\)/.*#\1#p' "$log" | head -1)
if [ -z "$port" ]; then
  fail "serve on 2 ranks: no ready line: $(tail -5 "$log")"
  kill -9 "$job" 2> /dev/null
else
  curl -sf "http://127.0.0.1:$port/v1/completions" -H 'Content-Type: application/json' \
    -d '{"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0}' > "$work/serve.json" \
    || fail "serve on 2 ranks: the request failed"
  grep -q '"text"' "$work/serve.json" || fail "serve on 2 ranks: $(head -c 300 "$work/serve.json")"
  rank1=""
  for p in $(pgrep -f "moeserve serve -m $model"); do
    tr '\0' '\n' < "/proc/$p/environ" 2> /dev/null | grep -qx "OMPI_COMM_WORLD_RANK=1" && rank1=$p
  done
  [ -n "$rank1" ] || fail "no rank 1 process found"
  [ -n "$rank1" ] && kill -9 "$rank1"
  curl -s -m 30 "http://127.0.0.1:$port/v1/completions" -H 'Content-Type: application/json' \
    -d '{"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0}' > /dev/null 2>&1
  for _ in $(seq 1 300); do kill -0 "$job" 2> /dev/null || break; sleep 0.1; done
  if kill -0 "$job" 2> /dev/null; then
    fail "the job still runs 30 s after rank 1 was killed"
    kill -9 "$job" 2> /dev/null
  else
    wait "$job" && fail "the job exited 0 after rank 1 was killed"
  fi
fi
pkill -9 -f "moeserve serve -m $model --port 0 -t 1 --layer-split mpi" 2> /dev/null
if [ "$failures" -ne 0 ]; then
  echo "$failures failure(s)" >&2
  exit 1
fi
echo "mpi layer split: ok"
