#!/usr/bin/env bash
# DFlash drafts end to end, the way a user gets there: a checkpoint
# directory converted with `moeserve convert`, then `generate --spec dflash
# --draft FILE` gives plain greedy output; and every way of getting it wrong
# stops before anything runs, with a message that says what to do.
#   dflash_test.sh MOESERVE_BIN FIXTURE_BIN TARGET_GGUF OTHER_TARGET_GGUF WORK_DIR
set -u
moeserve=$1
fixture=$2
target=$3
other=$4
work=$5
rm -rf "$work"
mkdir -p "$work"
failures=0
fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}
expect_in() { grep -qF -- "$2" "$1" || fail "$1 does not contain '$2': $(head -c 600 "$1")"; }

# The target's sizes, as inspect prints them.
"$moeserve" inspect "$target" > "$work/inspect.txt" 2>&1
hidden=$(awk '$1 ~ /\.embedding_length$/ {print $NF; exit}' "$work/inspect.txt")
layers=$(awk '$1 ~ /\.block_count$/ {print $NF; exit}' "$work/inspect.txt")
vocab=$(sed -n 's/^ *vocab size: *\([0-9]*\).*/\1/p' "$work/inspect.txt" | head -1)
[ -n "$hidden" ] && [ -n "$layers" ] && [ -n "$vocab" ] || { echo "FAIL: sizes of $target: $(head -30 "$work/inspect.txt")"; exit 1; }

"$fixture" "$work/ckpt" "$hidden" "$layers" "$vocab" || { echo "FAIL: fixture"; exit 1; }
"$moeserve" convert "$work/ckpt" -o "$work/draft.gguf" > "$work/convert.out" 2>&1 \
  || fail "convert of the draft checkpoint: $(tail -5 "$work/convert.out")"

prompt='def add(a, b):
    return a + b
'
"$moeserve" generate -m "$target" -p "$prompt" -n 24 --temp 0 --device cpu > "$work/plain.out" 2> "$work/plain.err" \
  || fail "plain generate: $(tail -3 "$work/plain.err")"
for tree in 0 12; do
  "$moeserve" generate -m "$target" -p "$prompt" -n 24 --temp 0 --device cpu --spec dflash --draft "$work/draft.gguf" \
    --spec-max 6 --spec-tree $tree > "$work/dflash$tree.out" 2> "$work/dflash$tree.err" \
    || fail "generate --spec dflash --spec-tree $tree: $(tail -3 "$work/dflash$tree.err")"
  cmp -s "$work/plain.out" "$work/dflash$tree.out" || fail "--spec dflash --spec-tree $tree changed the output"
  expect_in "$work/dflash$tree.err" "speculative (dflash)"
done

# The draft in a process of its own: the same text, the same drafts
# (--spec-fixed: every step drafts, whatever the timings).
for where in here proc:cpu; do
  extra=()
  [ "$where" = here ] || extra=(--device-draft "$where")
  "$moeserve" generate -m "$target" -p "$prompt" -n 24 --temp 0 --device cpu --spec dflash --draft "$work/draft.gguf" \
    --spec-max 6 --spec-tree 12 --spec-fixed "${extra[@]}" > "$work/fixed_$where.out" 2> "$work/fixed_$where.err" \
    || fail "generate --spec-fixed $where: $(tail -3 "$work/fixed_$where.err")"
  cmp -s "$work/plain.out" "$work/fixed_$where.out" || fail "the draft $where changed the output"
done
expect_in "$work/fixed_proc:cpu.err" "in a process of its own"
drafted() { sed -n 's/.* \([0-9]*\) drafted.*/\1/p' "$1" | head -1; }
[ -n "$(drafted "$work/fixed_here.err")" ] && [ "$(drafted "$work/fixed_proc:cpu.err")" = "$(drafted "$work/fixed_here.err")" ] \
  || fail "the draft process drafted $(drafted "$work/fixed_proc:cpu.err"), this process $(drafted "$work/fixed_here.err")"

# Mistakes: each exits non-zero before generating, saying what to do.
run_bad() {  # name expected-text args...
  local name=$1 want=$2
  shift 2
  "$moeserve" generate -p "$prompt" -n 4 --temp 0 --device cpu "$@" > "$work/$name.out" 2> "$work/$name.err"
  local rc=$?
  [ "$rc" -ne 0 ] || fail "$name: exit 0"
  [ ! -s "$work/$name.out" ] || fail "$name: generated text"
  expect_in "$work/$name.err" "$want"
}
run_bad no_draft "needs a draft model: add --draft FILE" -m "$target" --spec dflash
run_bad directory "convert the checkpoint first" -m "$target" --spec dflash --draft "$work/ckpt"
run_bad target_as_draft "not a DFlash draft" -m "$target" --spec dflash --draft "$target"
run_bad draft_as_model "is a DFlash draft model" -m "$work/draft.gguf"
run_bad wrong_target "does not fit the target model" -m "$other" --spec dflash --draft "$work/draft.gguf"
run_bad proc_device "--device-draft" -m "$target" --spec dflash --draft "$work/draft.gguf" --device-draft proc:gpu
run_bad tree_budget "--spec-tree must be 0" -m "$target" --spec dflash --draft "$work/draft.gguf" --spec-tree 99

if [ "$failures" -ne 0 ]; then
  echo "$failures failure(s)" >&2
  exit 1
fi
echo "dflash cli: ok"
