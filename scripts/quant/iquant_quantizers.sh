#!/usr/bin/env bash
# moeserve's i-quant quantizers against llama-quantize's on a tiny trained
# model (tests/data/models): each i-quant file type written by both, with the
# same importance matrix (moeserve imatrix, calibration text argparse.py +
# difflib.py) and, for moeserve, without one too; then moeserve perplexity
# of every file on held-out text (textwrap.py + shlex.py), the file sizes
# (the same per-tensor choices give the same size) and the quantize time.
#   LLAMA_BIN=/path/to/llama.cpp/build/bin scripts/quant/iquant_quantizers.sh [MODEL] [OUT_DIR]
# LLAMA_BIN must hold llama-quantize (llama.cpp built from .llamasrc, CPU only).
set -uo pipefail
cd "$(dirname "$0")/../.."
model=${1:-tests/data/models/qwen3moe-tiny.bf16.gguf}
out=${2:-/tmp/iquant_quantizers}
bin=${MOESERVE:-build/bin/moeserve}
ll=${LLAMA_BIN:?set LLAMA_BIN to llama.cpp build/bin}
mkdir -p "$out"
python3 - "$out" <<'PY'
import sys, sysconfig, os
root = sysconfig.get_paths()["stdlib"]
def text(files): return "\n".join(open(os.path.join(root, f), encoding="utf-8").read() for f in files)
open(os.path.join(sys.argv[1], "calib.txt"), "w").write(text(("argparse.py", "difflib.py")))
open(os.path.join(sys.argv[1], "eval.txt"), "w").write(text(("textwrap.py", "shlex.py")))
PY
"$bin" imatrix -m "$model" -f "$out/calib.txt" -o "$out/im.gguf" -c 128 > "$out/imatrix.log" 2>&1 || { tail -3 "$out/imatrix.log"; exit 1; }
ppl() { "$bin" perplexity -m "$1" -f "$out/eval.txt" -c 128 2>/dev/null | grep -oE 'PPL = [0-9.]+' | tail -1 | cut -d' ' -f3; }
mib() { python3 -c "import os,sys; print(f'{os.path.getsize(sys.argv[1]) / 2**20:.2f}')" "$1"; }
echo "bf16: ppl $(ppl "$model")"
printf '| type | moeserve quantize | + imatrix | llama-quantize + imatrix | MiB ours / llama.cpp | seconds ours (+ imatrix) |\n|---|---:|---:|---:|---:|---:|\n'
for type in ${TYPES:-IQ3_M IQ3_S IQ3_XS IQ3_XXS IQ2_M IQ2_S IQ2_XS IQ2_XXS}; do
  lower=$(tr 'A-Z' 'a-z' <<<"$type")
  plain=$out/ours.$type.gguf weighted=$out/ours_im.$type.gguf theirs=$out/llama_im.$type.gguf
  t0=$(date +%s.%N)
  "$bin" quantize "$model" "$plain" --type "$lower" --no-progress > "$out/q_$type.log" 2>&1
  t1=$(date +%s.%N)
  "$bin" quantize "$model" "$weighted" --type "$lower" --imatrix "$out/im.gguf" --no-progress > "$out/qi_$type.log" 2>&1
  t2=$(date +%s.%N)
  "$ll/llama-quantize" --imatrix "$out/im.gguf" "$model" "$theirs" "$type" > "$out/l_$type.log" 2>&1
  echo "| $type | $(ppl "$plain") | $(ppl "$weighted") | $(ppl "$theirs") | $(mib "$weighted") / $(mib "$theirs") |" \
    "$(python3 -c "print(f'{$t1 - $t0:.1f} ({$t2 - $t1:.1f})')") |"
done
