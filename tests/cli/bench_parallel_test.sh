#!/usr/bin/env bash
# Checks `moeserve bench --parallel` end to end: aggregate decode of N
# sequences, alone and with every step beside another sequence's prompt
# chunk (--parallel-chunk, the server's mixed steps), and that an out of
# range chunk is refused before anything runs.
#   bench_parallel_test.sh MOESERVE_BIN MODEL
set -u
moeserve=$1
model=$2
failures=0
fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}
out=$("$moeserve" bench -m "$model" -p 0 -n 8 -r 1 --parallel 2 2>&1) || fail "--parallel 2 exited $?: $out"
grep -qE '^decode, 2 sequences together: [0-9.]+ tok/s aggregate' <<<"$out" || fail "no aggregate line: $out"
out=$("$moeserve" bench -m "$model" -p 0 -n 8 -r 1 --parallel 1,3 --parallel-chunk 40 2>&1) ||
  fail "--parallel-chunk 40 exited $?: $out"
for n in 1 3; do
  grep -qE "^decode, $n sequences together, each step beside a 40-row prompt chunk: [0-9.]+ tok/s aggregate \([0-9.]+ ms per step of $n rows and 40 prompt rows\)" <<<"$out" ||
    fail "no mixed-step line for $n sequences: $out"
done
grep -q roofline <<<"$out" && fail "a mixed step printed a roofline share: $out"
out=$("$moeserve" bench -m "$model" -p 0 -n 8 --parallel 2 --parallel-chunk 9000 2>&1)
rc=$?
[ "$rc" -ne 0 ] || fail "--parallel-chunk 9000 exited 0"
grep -q -- '--parallel-chunk' <<<"$out" || fail "the refusal does not name --parallel-chunk: $out"
[ "$failures" -eq 0 ] && echo "bench_parallel_test: all checks passed"
exit "$failures"
