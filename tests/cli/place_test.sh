#!/usr/bin/env bash
# Checks `moeserve place` end to end: a placement for a budget is written and
# reads back; a budget below the dense weights, a size that is not one, a
# model without experts, and a placement file of the wrong model each exit 1
# with an error that says what to change.
#   place_test.sh MOESERVE_BIN MOE_MODEL DENSE_MODEL WORK_DIR
set -u
moeserve=$1
model=$2
dense=$3
work=$4
rm -rf "$work"
mkdir -p "$work"
failures=0
fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}
expect_in() { grep -qF -- "$2" "$1" || fail "$1 does not contain '$2': $(head -c 400 "$1")"; }
place() {  # place PREFIX ARGS...
  local prefix=$1
  shift
  "$moeserve" place "$@" >"$prefix.out" 2>"$prefix.err"
  rc=$?
}

place "$work/ok" -m "$model" --gpu-mem 13MiB --reserve 0 --ctx-size 256 -o "$work/p.json"
[ "$rc" -eq 0 ] || fail "place exited $rc: $(cat "$work/ok.err")"
expect_in "$work/ok.out" "hot: 36 of 64 experts"
expect_in "$work/ok.out" "every layer can run all-hot"
expect_in "$work/p.json" '"format": "moeserve-placement"'
expect_in "$work/p.json" '{"layer":3,"hot":[0,1,2,3,4,5,6,7,8]}'

place "$work/small" -m "$model" --gpu-mem 1MiB -o "$work/q.json"
[ "$rc" -eq 1 ] || fail "a budget below the dense weights exited $rc"
expect_in "$work/small.err" "raise --gpu-mem"
[ ! -e "$work/q.json" ] || fail "a refused placement wrote its file"

place "$work/junk" -m "$model" --gpu-mem " -1" -o "$work/q.json"
[ "$rc" -eq 1 ] || fail "--gpu-mem ' -1' exited $rc"
expect_in "$work/junk.err" "is not a size"

place "$work/dense" -m "$dense" --gpu-mem 1GiB -o "$work/q.json"
[ "$rc" -eq 1 ] || fail "a dense model exited $rc"
expect_in "$work/dense.err" "no stacked experts"

place "$work/stats" -m "$model" --gpu-mem 2GiB --stats "$work/p.json" -o "$work/q.json"
[ "$rc" -eq 1 ] || fail "a placement given as --stats exited $rc"
expect_in "$work/stats.err" 'format is "moeserve-placement", expected "moeserve-expert-stats"'

if [ "$failures" -ne 0 ]; then
  echo "place_test: $failures failure(s)" >&2
  exit 1
fi
echo "place_test: ok"
