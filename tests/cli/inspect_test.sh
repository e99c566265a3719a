#!/usr/bin/env bash
# Checks `moeserve inspect` end to end.
#   inspect_test.sh MOESERVE_BIN FIXTURE_WRITER_BIN WORK_DIR
set -u
moeserve=$1
writer=$2
work=$3
rm -rf "$work"
mkdir -p "$work"

failures=0
fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}
# expect_in FILE TEXT: FILE contains TEXT (fixed string)
expect_in() {
  grep -qF -- "$2" "$1" || fail "$1 does not contain '$2'"
}
# run_inspect OUT_PREFIX ARGS...: runs inspect, stdout/stderr to files, sets rc
run_inspect() {
  local prefix=$1
  shift
  "$moeserve" inspect "$@" >"$prefix.out" 2>"$prefix.err"
  rc=$?
}

good=$work/tiny.gguf
"$writer" "$good" || { echo "FAIL: fixture writer failed" >&2; exit 1; }

# A valid file: exit 0; architecture, hyperparameters, tokenizer, tensors.
run_inspect "$work/good" "$good"
[ "$rc" -eq 0 ] || fail "inspect of a valid file exited $rc: $(cat "$work/good.err")"
expect_in "$work/good.out" "architecture:  qwen3moe"
expect_in "$work/good.out" "qwen3moe.expert_count"
expect_in "$work/good.out" "blk.0.ffn_gate_exps.weight"
expect_in "$work/good.out" "[256, 8, 4]"
expect_in "$work/good.out" "vocab size:     8"
expect_in "$work/good.out" '7 "<|im_end|>"'
expect_in "$work/good.out" "chat template:  yes"
expect_in "$work/good.out" "totals: 5 tensors"
grep -qF '"Ġthe"' "$work/good.out" && fail "vocabulary dumped without --all-keys"

# --all-keys lists the vocabulary.
run_inspect "$work/all" --all-keys "$good"
[ "$rc" -eq 0 ] || fail "inspect --all-keys exited $rc"
expect_in "$work/all.out" '"Ġthe"'
expect_in "$work/all.out" "tokenizer.ggml.merges"

# --json: one object with the same facts.
run_inspect "$work/json" --json "$good"
[ "$rc" -eq 0 ] || fail "inspect --json exited $rc"
expect_in "$work/json.out" '"architecture": "qwen3moe"'
expect_in "$work/json.out" '"name": "output.weight"'
if command -v python3 >/dev/null; then
  python3 -c 'import json,sys; json.load(open(sys.argv[1]))' "$work/json.out" || fail "--json output is not JSON"
fi

# Truncated inside the tensor data: exit 1, "error: FILE: tensor ...: reason".
data_offset=$(grep -o '"data_offset": [0-9]*' "$work/json.out" | grep -o '[0-9]*$')
cut=$work/cut.gguf
head -c "$((data_offset + 10))" "$good" >"$cut"
run_inspect "$work/cut" "$cut"
[ "$rc" -eq 1 ] || fail "inspect of a truncated file exited $rc"
expect_in "$work/cut.err" "error: $cut: tensor"
expect_in "$work/cut.err" "runs past the end of the file"
[ -s "$work/cut.out" ] && fail "inspect of a truncated file printed to stdout"

# Truncated inside the metadata.
head -c 300 "$good" >"$work/meta.gguf"
run_inspect "$work/meta" "$work/meta.gguf"
[ "$rc" -eq 1 ] || fail "inspect of a file cut in its metadata exited $rc"
expect_in "$work/meta.err" "error: $work/meta.gguf: "

# Missing file.
run_inspect "$work/missing" "$work/missing.gguf"
[ "$rc" -eq 1 ] || fail "inspect of a missing file exited $rc"
expect_in "$work/missing.err" "error: $work/missing.gguf: cannot open: No such file or directory"

# Not a GGUF file.
echo "hello world, not a model" >"$work/text.gguf"
run_inspect "$work/text" "$work/text.gguf"
[ "$rc" -eq 1 ] || fail "inspect of a text file exited $rc"
expect_in "$work/text.err" "bad magic"

if [ "$failures" -ne 0 ]; then
  echo "$failures check(s) failed" >&2
  exit 1
fi
echo "inspect_test: all checks passed"
