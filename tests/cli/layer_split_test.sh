#!/usr/bin/env bash
# --layer-split end to end: generate over two and three CPU shards, in this
# process and in shard processes (proc:cpu), gives the unsplit text; inspect
# prints the plan; a bad split stops before anything loads, saying what is
# accepted.
#   layer_split_test.sh MOESERVE_BIN MODEL_GGUF WORK_DIR
set -u
moeserve=$1
model=$2
work=$3
rm -rf "$work"
mkdir -p "$work"
failures=0
fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}
expect_in() { grep -q -- "$2" "$1" || fail "$1 does not contain '$2': $(head -c 600 "$1")"; }
prompt='class Stack:
    def push(self, x):
'
"$moeserve" generate -m "$model" -p "$prompt" -n 32 --temp 0 --device cpu > "$work/plain.out" 2> "$work/plain.err" \
  || fail "plain generate: $(tail -3 "$work/plain.err")"
for spec in cpu,cpu cpu=0:1,cpu=1:3,cpu=3:4 cpu=3,cpu=1 cpu,proc:cpu proc:cpu=0:1,cpu=1:3,proc:cpu=3:4; do
  "$moeserve" generate -m "$model" -p "$prompt" -n 32 --temp 0 --layer-split "$spec" > "$work/split.out" \
    2> "$work/split.err" || fail "--layer-split $spec: $(tail -3 "$work/split.err")"
  cmp -s "$work/plain.out" "$work/split.out" || fail "--layer-split $spec changed the output"
done
# Speculative decoding through a shard process: draft trees verified there
# (its K/V rows moved and recurrent states kept per node), the plain text.
for spec in cpu,proc:cpu proc:cpu,cpu; do
  "$moeserve" generate -m "$model" -p "$prompt$prompt" -n 32 --temp 0 --device cpu > "$work/plain2.out" 2> /dev/null
  "$moeserve" generate -m "$model" -p "$prompt$prompt" -n 32 --temp 0 --layer-split "$spec" --spec ngram \
    --spec-tree 8 > "$work/spec.out" 2> "$work/spec.err" || fail "--layer-split $spec --spec ngram: $(tail -3 "$work/spec.err")"
  cmp -s "$work/plain2.out" "$work/spec.out" || fail "--layer-split $spec --spec ngram --spec-tree 8 changed the output"
done
# Pipelined micro-batches (the CPU beside a shard process: two lanes): a
# long prompt in forwards of 4 x 8 rows (--micro-batch-rows 8), and an expert worker for the CPU
# shards' experts: the plain text each time.
long="$prompt$prompt$prompt$prompt$prompt"
"$moeserve" generate -m "$model" -p "$long" -n 24 --temp 0 --device cpu > "$work/plain3.out" 2> /dev/null
"$moeserve" generate -m "$model" -p "$long" -n 24 --temp 0 -b 8 --layer-split cpu,proc:cpu --micro-batches 4 --micro-batch-rows 8 \
  > "$work/pipe.out" 2> "$work/pipe.err" || fail "--micro-batches 4: $(tail -3 "$work/pipe.err")"
cmp -s "$work/plain3.out" "$work/pipe.out" || fail "--layer-split cpu,proc:cpu --micro-batches 4 changed the output"
"$moeserve" generate -m "$model" -p "$prompt" -n 32 --temp 0 --layer-split cpu,cpu --expert-worker spawn \
  > "$work/worker.out" 2> "$work/worker.err" || fail "--layer-split with --expert-worker: $(tail -3 "$work/worker.err")"
cmp -s "$work/plain.out" "$work/worker.out" || fail "--layer-split cpu,cpu --expert-worker spawn changed the output"
expect_in "$work/worker.err" "computed by the expert worker"
"$moeserve" inspect --layer-split cpu=0:3,cpu=3:4 "$model" > "$work/inspect.out" 2>&1 || fail "inspect --layer-split"
expect_in "$work/inspect.out" "shard 0: cpu"
expect_in "$work/inspect.out" "layers   3:4"
expect_in "$work/inspect.out" "output head"
run_bad() {  # name expected-text args...
  local name=$1 want=$2
  shift 2
  "$moeserve" generate -m "$model" -p "$prompt" -n 4 --temp 0 "$@" > "$work/$name.out" 2> "$work/$name.err"
  [ $? -ne 0 ] || fail "$name: exit 0"
  [ ! -s "$work/$name.out" ] || fail "$name: generated text"
  expect_in "$work/$name.err" "$want"
}
run_bad unknown "unknown device" --layer-split cpu,tpu
run_bad gap "without gaps or overlaps" --layer-split cpu=0:2,cpu=3:4
run_bad too_many "5 shards for the 4 layers" --layer-split cpu,cpu,cpu,cpu,cpu
run_bad attach "the shard process\|connect" --layer-split cpu,proc:unix:$work/nobody.sock
run_bad mpi_outside "runs under mpirun\|built without MPI" --layer-split mpi:0,mpi:1
run_bad with_device "names its devices" --layer-split cpu,cpu --device cpu
if [ "$failures" -ne 0 ]; then
  echo "$failures failure(s)" >&2
  exit 1
fi
echo "layer split cli: ok"
