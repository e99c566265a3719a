#!/usr/bin/env bash
# Checks `moeserve perplexity` end to end: llama.cpp's output lines (the
# running "[i]ppl," values and "Final estimate: PPL = X +/- Y") on a text
# file, --chunks, and the errors for a text too short and a missing file.
#   perplexity_test.sh MOESERVE_BIN MODEL WORK_DIR
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
expect_in() { grep -qE -- "$2" "$1" || fail "$1 does not match '$2': $(head -c 400 "$1")"; }

for i in $(seq 1 40); do echo "def f$i(x):"; echo "    return x * $i + $((i % 7))"; echo; done > "$work/text.txt"
"$moeserve" perplexity -m "$model" -f "$work/text.txt" -c 32 --chunks 3 -t 2 > "$work/ok.out" 2> "$work/ok.err"
rc=$?
[ "$rc" -eq 0 ] || fail "perplexity exited $rc: $(tail -3 "$work/ok.err")"
expect_in "$work/ok.out" '^\[1\][0-9]+\.[0-9]{4},\[2\][0-9]+\.[0-9]{4},\[3\][0-9]+\.[0-9]{4},$'
expect_in "$work/ok.out" '^Final estimate: PPL = [0-9]+\.[0-9]{4} \+/- [0-9]+\.[0-9]{5}$'
expect_in "$work/ok.err" 'chunks of 32'

echo "def f(x): return x" > "$work/short.txt"
"$moeserve" perplexity -m "$model" -f "$work/short.txt" -c 32 > "$work/short.out" 2> "$work/short.err"
[ $? -eq 1 ] || fail "a text too short must exit 1"
expect_in "$work/short.err" 'needs at least 64'

"$moeserve" perplexity -m "$model" -f "$work/missing.txt" > /dev/null 2> "$work/missing.err"
[ $? -eq 1 ] || fail "a missing file must exit 1"
expect_in "$work/missing.err" 'cannot open'

[ "$failures" -eq 0 ] && echo "perplexity_test: ok"
exit "$failures"
