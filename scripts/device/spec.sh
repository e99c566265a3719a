#!/usr/bin/env bash
# Speculative decoding (issue 40) on the device machine:
#   scripts/device/spec.sh start   # build, start making the 30b-a3b file, GPU tests, tiny-model benches
#   scripts/device/spec.sh bench   # wait for the file, then plain vs --spec ngram, all-GPU and --n-cpu-moe 24
#   scripts/device/spec.sh dflash  # train a DFlash draft per tiny target (scripts/train_tiny/train_dflash.py),
#                                  # convert it, bench plain vs ngram vs dflash chain / trees (DFLASH_ARCHES, DFLASH_SECONDS)
#   scripts/device/spec.sh small_train  # build, the corpus, train a ~245M qwen3moe (train_model.py --preset small,
#                                  # TARGET_SECONDS), convert it; then in a second call (the machine kept warm):
#   scripts/device/spec.sh small_bench  # train its DFlash draft (DRAFT_SECONDS), convert, bench plain vs ngram vs
#                                  # dflash chain / trees vs auto, all-GPU and with experts on the CPU
#   scripts/device/spec.sh small_profile  # build (moeserve, kernel tests), GPU kernel tests, the small target's
#                                  # shape trained briefly (TARGET_SECONDS, default 20), then where its verify
#                                  # forwards of 1/8/16 rows spend their time (profile_verify.sh, Nsight Compute)
#   scripts/device/spec.sh small_all  # everything in one call: build, target (TARGET_SECONDS, default 150)
#                                  # while moeserve builds, its draft trained on its own greedy text as well
#                                  # (DRAFT_SECONDS, default 110; DISTILL_SEQS), the target in Q4_K_M, then plain vs
#                                  # ngram vs dflash chain / tree vs auto, all-GPU (and auto with --n-cpu-moe 4);
#                                  # TARGET_STEPS fixes the target's steps, EDIT_PAIRS adds rename-edit examples
#                                  # to its corpus (corpus_tokenizer.py), SMALL_EXTRA_SPECS more --spec runs
#                                  # ('_' for spaces), EXTRA_TARGETS more build targets
#   scripts/device/spec.sh small_peer  # llama.cpp on small_all's trained target: llama-bench tg128 and llama-lookup
#                                  # on each prompt set, all-GPU and -ncmoe 4 (the llama.cpp build as for peer)
#   scripts/device/spec.sh peer    # llama.cpp on the same file: llama-bench tg128 and llama-lookup (its
#                                  # prompt-lookup decoding) on the code-editing prompt (carry .llamasrc;
#                                  # LLAMA_TARGETS="llama-bench llama-lookup" scripts/device/llamacpp_gpu.sh build first)
set -uo pipefail
cd "$(dirname "$0")/../.."
export LD_LIBRARY_PATH=/tmp/devroot/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
out=${OUT:-/tmp/out}
mkdir -p "$out"
bin=build-gpu/bin/moeserve
m30=/tmp/30b-skew0.gguf
# The small qwen3moe target: builds moeserve (and $2..) in the background while
# the corpus is made and the target trains $1 seconds (wait_for_build then).
ts=/tmp/ts
train_small_target() {
  local seconds=$1; shift
  mkdir -p $ts/logs
  (scripts/device/build.sh build-gpu 90a moeserve "$@" > "$out/build.log" 2>&1; echo $? > $ts/build.rc) &
  python3 scripts/train_tiny/corpus_tokenizer.py --out $ts/data --template tests/reference/templates/qwen3.jinja \
    --edit-pairs ${EDIT_PAIRS:-0} > $ts/logs/corpus.log 2>&1 || { tail -5 $ts/logs/corpus.log; exit 1; }
  python3 scripts/train_tiny/train_model.py --arch qwen3moe --preset small --data $ts/data \
    --out $ts/hf/qwen3moe-small --summary $ts/train_small.json --seconds "$seconds" --steps ${TARGET_STEPS:-0} --lr ${LR:-1e-3} \
    > $ts/logs/train.log 2>&1 || { tail -20 $ts/logs/train.log; cp $ts/logs/train.log "$out/"; exit 1; }
  grep -E 'params|heldout|steps' $ts/logs/train.log | cut -c1-300 | tail -3
  cp $ts/logs/train.log $ts/train_small.json "$out/" 2>/dev/null
}
wait_for_build() {
  wait
  [ "$(cat $ts/build.rc)" = 0 ] || { grep -E 'error|FAILED' -A3 "$out/build.log" | head -40; exit 1; }
}
case "${1:-start}" in
  start)
    nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
    scripts/device/build.sh build-gpu 90a moeserve test_spec test_runtime test_server test_kernels_gpu test_models \
      test_moe > "$out/build.log" 2>&1 || { grep -E 'error|FAILED' -A3 "$out/build.log" | head -40; exit 1; }
    cp "$bin" /tmp/moeserve-mm
    if [ ! -f "$m30.done" ] && ! pgrep -f moeserve-mm >/dev/null; then
      setsid nohup sh -c "/tmp/moeserve-mm make-model --arch qwen3moe --preset 30b-a3b --type q4_k_m --quick-quant \
        --router-skew 0 -o $m30 && touch $m30.done" > /tmp/make30.log 2>&1 < /dev/null &
    fi
    build-gpu/tests/kernels_gpu/test_kernels_gpu > "$out/kernels_gpu.log" 2>&1
    echo "kernels_gpu: $(grep -E '^\[  (PASSED|FAILED)' "$out/kernels_gpu.log" | tr '\n' ' ')"
    grep -E '^\[  FAILED|Failure' -A6 "$out/kernels_gpu.log" | head -30
    MOESERVE_TEST_DEVICE=cuda build-gpu/tests/models/test_models --gtest_filter='*Gpu*:Placement*:ExpertSplit*' \
      > "$out/models.log" 2>&1
    echo "models (gpu): $(grep -E '^\[  (PASSED|FAILED)|parity-gpu' "$out/models.log" | tr '\n' ' ')"
    for t in spec runtime server moe; do
      MOESERVE_TEST_DEVICE=cuda build-gpu/tests/$t/test_$t > "$out/$t.log" 2>&1
      echo "$t (cuda): $(grep -E '^\[  (PASSED|FAILED)' "$out/$t.log" | tr '\n' ' ')"
      grep -E '^\[  FAILED|Failure' -A6 "$out/$t.log" | head -30
    done
    for arch in qwen3moe qwen35moe; do
      echo "== $arch tiny, cuda"
      $bin bench -m tests/data/models/$arch-tiny.bf16.gguf -p 64 -n 128 -r 2 --device cuda --spec ngram 2>&1 \
        | tee "$out/bench_tiny_$arch.txt" | sed -n '/verify cost/,$p'
      echo "== $arch tiny, cuda, draft tree of 16"
      $bin bench -m tests/data/models/$arch-tiny.bf16.gguf -p 64 -n 128 -r 2 --device cuda --spec ngram --spec-tree 16 \
        2>&1 | sed -n '/speculative decoding/,$p'
    done;;
  bench)
    if [ ! -f "$m30.done" ] && ! pgrep -f moeserve-mm >/dev/null; then
      cp "$bin" /tmp/moeserve-mm
      /tmp/moeserve-mm make-model --arch qwen3moe --preset 30b-a3b --type q4_k_m --quick-quant --router-skew 0 \
        -o $m30 > /tmp/make30.log 2>&1 && touch $m30.done
    fi
    for i in $(seq 1 100); do [ -f "$m30.done" ] && break; sleep 5; done
    [ -f "$m30.done" ] || { echo "model not ready: $(tail -c 300 /tmp/make30.log)"; exit 1; }
    for args in "" "--n-cpu-moe 24"; do
      echo "== 30b-a3b Q4_K_M, cuda $args"
      $bin bench -m $m30 -p 512 -n 128 -r ${REPS:-1} --device cuda $args --spec ngram ${SPEC_ARGS:-} 2>&1 \
        | tee "$out/bench_30b_${args// /_}.txt" | grep -E 'tg128|pp512|rows|ms|decode step|prompt|---|code|chat|error'
    done;;
  dflash)
    [ -x "$bin" ] || scripts/device/build.sh build-gpu 90a moeserve > "$out/build.log" 2>&1
    for arch in ${DFLASH_ARCHES:-qwen3 qwen3moe}; do
      d=/tmp/dflash-$arch
      echo "== train a DFlash draft for $arch-tiny (${DFLASH_SECONDS:-100} s)"
      python3 scripts/train_tiny/train_dflash.py --arch $arch --out $d --seconds ${DFLASH_SECONDS:-100} \
        > "$out/train_dflash_$arch.log" 2>&1 || { tail -20 "$out/train_dflash_$arch.log"; continue; }
      grep -v '^step' "$out/train_dflash_$arch.log"; grep '^step' "$out/train_dflash_$arch.log" | tail -2
      mkdir -p "$out/dflash-$arch" && cp $d/config.json $d/train_summary.json $d/model.safetensors "$out/dflash-$arch/"
      $bin convert $d -o $d.gguf --type bf16 2>&1 | tail -1
      m=tests/data/models/$arch-tiny.bf16.gguf
      for spec in "ngram" "dflash --draft $d.gguf --spec-max 15" "dflash --draft $d.gguf --spec-max 15 --spec-fixed" \
                  "dflash --draft $d.gguf --spec-max 15 --spec-tree 16 --spec-fixed" "auto --draft $d.gguf --spec-max 15"; do
        echo "== $arch tiny, cuda, --spec $spec"
        $bin bench -m $m -p 64 -n 128 -r 2 --device cuda --spec $spec 2>&1 | sed -n '/speculative decoding/,$p'
      done
      $bin generate -m $m --device cuda -n 96 --temp 0 --spec dflash --draft $d.gguf --spec-max 15 \
        -p "import os
def main():
    " 2>&1 | tail -3
    done;;
  dflash30)
    # A DFlash draft of the published shape for Qwen3-30B-A3B (5 layers, 32 heads of 128, FF 6144;
    # random weights: acceptance ~0, so this measures the draft's cost and the policy switching it off).
    for i in $(seq 1 100); do [ -f "$m30.done" ] && break; sleep 5; done
    [ -f "$m30.done" ] || { echo "model not ready: $(tail -c 300 /tmp/make30.log)"; exit 1; }
    d=/tmp/dflash-30b
    if [ ! -f $d.gguf ]; then
      build-gpu/tests/cli/dflash_cli_fixture $d 2048 48 151936 5 32 4 128 6144 && $bin convert $d -o $d.gguf --type bf16 2>&1 | tail -1
    fi
    for args in "" "--n-cpu-moe 24"; do
      echo "== 30b-a3b Q4_K_M, cuda $args: generate --spec dflash (adaptive off: every step drafts 15)"
      $bin generate -m $m30 --device cuda $args -n 64 --temp 0 --spec dflash --draft $d.gguf \
        --spec-max 15 --spec-fixed -p "def fibonacci(n):" 2>&1 | grep -E 'speculative|decode|error'
      echo "== 30b-a3b Q4_K_M, cuda $args: bench --spec auto --draft (adaptive)"
      $bin bench -m $m30 -p 0 -n 128 -r 1 --device cuda $args --spec auto --draft $d.gguf --spec-max 15 2>&1 \
        | sed -n '/speculative decoding/,$p'
    done;;
  small_train)
    train_small_target ${TARGET_SECONDS:-300}
    wait_for_build
    $bin convert $ts/hf/qwen3moe-small -o $ts/small.bf16.gguf --type bf16 2>&1 | tail -1
    $bin quantize $ts/small.bf16.gguf $ts/small.q8_0.gguf --type q8_0 2>&1 | tail -1
    ls -la $ts/*.gguf;;
  small_profile)
    train_small_target ${TARGET_SECONDS:-20} test_kernels_gpu
    wait_for_build
    $bin convert $ts/hf/qwen3moe-small -o $ts/small.bf16.gguf --type bf16 2>&1 | tail -1
    $bin quantize $ts/small.bf16.gguf $ts/small.q8_0.gguf --type q8_0 2>&1 | tail -1
    build-gpu/tests/kernels_gpu/test_kernels_gpu > "$out/kernels_gpu.log" 2>&1
    echo "kernels_gpu: $(grep -E '^\[  (PASSED|FAILED)' "$out/kernels_gpu.log" | tr '\n' ' ')"
    grep -E '^\[  FAILED|Failure' -A6 "$out/kernels_gpu.log" | head -30
    MODEL=$ts/small.q8_0.gguf scripts/device/profile_verify.sh small q8_0 nobuild;;
  small_all)
    train_small_target ${TARGET_SECONDS:-150} ${EXTRA_TARGETS:-}
    python3 scripts/train_tiny/train_dflash.py --arch qwen3moe --target-dir $ts/hf/qwen3moe-small --target-gguf hf \
      --out $ts/dflash --seconds ${DRAFT_SECONDS:-110} --distill-seqs ${DISTILL_SEQS:-256} > $ts/logs/dflash.log 2>&1 \
      || { tail -20 $ts/logs/dflash.log; exit 1; }
    grep -v '^step' $ts/logs/dflash.log; grep '^step' $ts/logs/dflash.log | tail -2
    cp $ts/logs/dflash.log $ts/dflash/train_summary.json "$out/" 2>/dev/null
    wait_for_build
    $bin convert $ts/hf/qwen3moe-small -o $ts/small.bf16.gguf --type bf16 2>&1 | tail -1
    $bin quantize $ts/small.bf16.gguf $ts/small.q4_k_m.gguf --type q4_k_m 2>&1 | tail -1
    $bin convert $ts/dflash -o $ts/dflash.gguf --type bf16 2>&1 | tail -1
    m=$ts/small.q4_k_m.gguf d=$ts/dflash.gguf
    for spec in "dflash --draft $d --spec-max 15" "auto --draft $d --spec-max 15" \
                "dflash --draft $d --spec-max 15 --spec-tree 16" "dflash --draft $d --spec-max 7" "ngram" \
                "auto --draft $d --spec-max 15 --n-cpu-moe 4" ${SMALL_EXTRA_SPECS:-}; do
      echo "== qwen3moe-small q4_k_m, cuda, --spec ${spec//_/ }"
      $bin bench -m $m -p 64 -n 128 -r 2 --device cuda --spec ${spec//_/ } 2>&1 \
        | tee -a "$out/bench_small.txt" | sed -n '/speculative decoding/,$p' | grep -v '^$' | head -12
    done
    # What the target writes for the code-editing prompt (does it quote the code back?).
    edit_prompt=$(python3 -c "import re; l=open('bench/spec_prompts.txt').readline().rstrip('\\n'); \
print(re.sub(r'\\\\([n\\\\])', lambda m: '\\n' if m.group(1) == 'n' else '\\\\', l), end='')")
    edit_prompt+=$'\n'  # $(...) dropped the prompt's final newline
    $bin generate -m $m -p "$edit_prompt" -n 128 --temp 0 --device cuda --spec ngram > "$out/edit_output.txt" \
      2> "$out/edit_output.err"; tail -2 "$out/edit_output.err";;
  small_corpus)
    # The DFlash draft in the engine on text like its training text: the target (TARGET_SECONDS) and its
    # draft (DRAFT_SECONDS, on the target's own greedy text too), then bench on three held-out corpus
    # prompts (the target's continuations of them are what the draft's teacher-forced acceptance
    # measures) and on bench's built-in prompts: dflash with every step drafting (--spec-fixed), adaptive, ngram.
    train_small_target ${TARGET_SECONDS:-90}
    python3 scripts/train_tiny/train_dflash.py --arch qwen3moe --target-dir $ts/hf/qwen3moe-small --target-gguf hf \
      --out $ts/dflash --seconds ${DRAFT_SECONDS:-120} --distill-seqs ${DISTILL_SEQS:-128} > $ts/logs/dflash.log 2>&1 \
      || { tail -20 $ts/logs/dflash.log; exit 1; }
    grep -v '^step' $ts/logs/dflash.log | tail -2
    python3 - $ts <<'PY'
import json, sys, numpy as np
from tokenizers import Tokenizer
ts = sys.argv[1]
tok = Tokenizer.from_file(f"{ts}/hf/qwen3moe-small/tokenizer.json")
ids = np.load(f"{ts}/data/heldout_ids.npy")
with open("/tmp/corpus_prompts.txt", "w") as f:
    for start in (1000, 9000, 17000):
        t = tok.decode([int(x) for x in ids[start:start + 160]])
        f.write(t.replace("\\", "\\\\").replace("\n", "\\n") + "\n")
PY
    wait_for_build
    $bin convert $ts/hf/qwen3moe-small -o $ts/small.bf16.gguf --type bf16 2>&1 | tail -1
    $bin quantize $ts/small.bf16.gguf $ts/small.q4_k_m.gguf --type q4_k_m 2>&1 | tail -1
    $bin convert $ts/dflash -o $ts/dflash.gguf --type bf16 2>&1 | tail -1
    m=$ts/small.q4_k_m.gguf d=$ts/dflash.gguf
    for run in "--spec-prompts /tmp/corpus_prompts.txt --spec dflash --draft $d --spec-max 15 --spec-fixed" \
               "--spec-prompts /tmp/corpus_prompts.txt --spec dflash --draft $d --spec-max 15" \
               "--spec-prompts /tmp/corpus_prompts.txt --spec ngram" "--spec dflash --draft $d --spec-max 15 --spec-fixed"; do
      echo "== small q4_k_m, cuda, $run" | sed 's#/tmp/[a-z_/]*/##g'
      $bin bench -m $m -p 0 -n 128 -r 2 --device cuda $run 2>&1 | tee -a "$out/bench_corpus.txt" \
        | grep -E '^\| (code|chat|prompt [0-9])|^\| [0-9]|error' | head -6
    done;;
  small_bench)
    ts=/tmp/ts
    [ -f $ts/small.bf16.gguf ] || { echo "no trained target: run small_train first (machine released?)"; exit 1; }
    python3 scripts/train_tiny/train_dflash.py --arch qwen3moe --target-dir $ts/hf/qwen3moe-small \
      --target-gguf $ts/small.bf16.gguf --out $ts/dflash --seconds ${DRAFT_SECONDS:-150} > $ts/logs/dflash.log 2>&1 \
      || { tail -20 $ts/logs/dflash.log; exit 1; }
    grep -v '^step' $ts/logs/dflash.log; grep '^step' $ts/logs/dflash.log | tail -2
    cp $ts/logs/dflash.log $ts/dflash/train_summary.json "$out/" 2>/dev/null
    $bin convert $ts/dflash -o $ts/dflash.gguf --type bf16 2>&1 | tail -1
    m=$ts/small.q8_0.gguf
    specs=${SPECS:-ngram dflash dflash_tree auto}
    for place in "" "--n-cpu-moe 4"; do
      for name in $specs; do
        case $name in
          ngram) spec="ngram";;
          dflash) spec="dflash --draft $ts/dflash.gguf --spec-max 15";;
          dflash_tree) spec="dflash --draft $ts/dflash.gguf --spec-max 15 --spec-tree 16";;
          auto) spec="auto --draft $ts/dflash.gguf --spec-max 15";;
        esac
        echo "== qwen3moe-small q8_0, cuda $place, --spec $spec"
        $bin bench -m $m -p 64 -n 128 -r 2 --device cuda $place --spec $spec 2>&1 \
          | tee -a "$out/bench_small.txt" | sed -n '/speculative decoding/,$p' | grep -v '^$' | head -20
      done
    done;;
  small_peer)
    # llama.cpp on the trained target (small_all's file, the machine kept warm): llama-bench tg128 (plain),
    # then llama-lookup (its prompt-lookup decoding, up to 8 drafted a step) on each of bench's prompt sets.
    m=$ts/small.q4_k_m.gguf
    [ -f $m ] || { echo "no trained target: run small_all first (machine released?)"; exit 1; }
    python3 - <<'PY'
import re
for i, l in enumerate(open('bench/spec_prompts.txt')):
    t = re.sub(r'\\([n\\])', lambda m: '\n' if m.group(1) == 'n' else '\\', l.rstrip('\n'))
    open(f'/tmp/prompt_{i}.txt', 'w').write(t)
PY
    for args in "" "-ncmoe 4"; do
      echo "== llama.cpp on the trained target q4_k_m ${args}"
      WAIT_STEPS=150 scripts/device/llamacpp_gpu.sh bench $m -p 0 -n 128 -r 3 -ngl 99 -fa 1 $args 2>&1 \
        | grep -E 'tg128|error'
      long=${args/-ncmoe/--n-cpu-moe}
      for i in 0 1 2; do
        scripts/device/llamacpp_gpu.sh run llama-lookup -m $m -f /tmp/prompt_$i.txt -n 128 --spec-draft-n-max 8 -ngl 99 \
          -fa on --temp 0 $long 2>&1 | grep -E 'decoded|n_drafted|n_accept|accept  |error' | sed "s/^/  set $i: /"
      done
    done;;
  peer)
    for i in $(seq 1 100); do [ -f "$m30.done" ] && break; sleep 5; done
    python3 -c "import re,sys; l=open('bench/spec_prompts.txt').readline().rstrip('\\n'); sys.stdout.write(re.sub(r'\\\\([n\\\\])', lambda m: '\\n' if m.group(1) == 'n' else '\\\\', l))" > /tmp/edit_prompt.txt
    for args in "" "-ncmoe 24"; do
      echo "== llama.cpp on 30b-a3b Q4_K_M ${args}"
      WAIT_STEPS=150 scripts/device/llamacpp_gpu.sh bench $m30 -p 0 -n 128 -r 2 -ngl 99 -fa 1 $args 2>&1 | grep -E 'tg128|error'
      long=${args/-ncmoe/--n-cpu-moe}
      scripts/device/llamacpp_gpu.sh run llama-lookup -m $m30 -f /tmp/edit_prompt.txt -n 128 --spec-draft-n-max 8 -ngl 99 \
        -fa on --temp 0 $long 2>&1 | grep -E 'decoded|n_drafted|n_accept|accept  |error' | sed 's/^/  lookup: /'
    done;;
esac
