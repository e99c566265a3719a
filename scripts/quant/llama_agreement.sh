#!/usr/bin/env bash
# moeserve against llama.cpp on files llama.cpp's own quantizer wrote: each
# type of a tiny trained model (tests/data/models), greedy continuations
# compared (node-llama-cpp's prebuilt llama.cpp, bench/llamacpp/
# greedy_llamacpp.mjs) and perplexity from both tools on the same text.
# The i-quants of 1-3 bits need an importance matrix: moeserve imatrix
# writes it, llama-quantize reads it (a check of the format too).
#   LLAMA_BIN=/path/to/llama.cpp/build/bin scripts/quant/llama_agreement.sh [MODEL] [OUT_DIR]
# LLAMA_BIN must hold llama-quantize and llama-perplexity (llama.cpp built
# from .llamasrc/llama.tar.xz, CPU only).
set -uo pipefail
cd "$(dirname "$0")/../.."
model=${1:-tests/data/models/qwen3moe-tiny.bf16.gguf}
out=${2:-/tmp/llama_agreement}
bin=${MOESERVE:-build/bin/moeserve}
ll=${LLAMA_BIN:?set LLAMA_BIN to llama.cpp build/bin}
mkdir -p "$out"
text=$out/text.txt
python3 - "$text" <<'PY'
import sys, sysconfig, os
root = sysconfig.get_paths()["stdlib"]
# Held-out modules (training took stdlib files by index; these are a few
# mid-size ones, the same text for both tools).
parts = [open(os.path.join(root, f), encoding="utf-8").read() for f in ("textwrap.py", "shlex.py")]
open(sys.argv[1], "w", encoding="utf-8").write("\n".join(parts))
PY
"$bin" imatrix -m "$model" -f "$text" -o "$out/imatrix.gguf" -c 128 > "$out/imatrix.log" 2>&1 || { tail -3 "$out/imatrix.log"; exit 1; }
prompts=("def parse_args(argv):" "import os
import sys

class Config:")
printf '| type | file MiB | greedy (2 prompts x 32 tokens) | ppl moeserve | ppl llama.cpp |\n|---|---:|---|---:|---:|\n'
for type in ${TYPES:-BF16 Q8_0 Q6_K Q5_K_M Q4_K_M Q4_0 Q4_1 Q5_0 Q5_1 Q3_K_M Q2_K IQ4_NL IQ4_XS MXFP4_MOE IQ3_S IQ3_XXS IQ2_S IQ2_XS IQ2_XXS IQ1_M IQ1_S}; do
  f=$out/$(basename "$model" .bf16.gguf).$type.gguf
  if [ "$type" = BF16 ]; then cp "$model" "$f"; else
    "$ll/llama-quantize" --imatrix "$out/imatrix.gguf" "$model" "$f" "$type" > "$out/quantize_$type.log" 2>&1 \
      || { echo "| $type | llama-quantize failed: $(grep -iE 'error|failed' "$out/quantize_$type.log" | head -1) |"; continue; }
  fi
  agree=""
  for p in "${prompts[@]}"; do
    ours=$("$bin" generate -m "$f" -p "$p" -n 32 --temp 0 --threads 2 2>/dev/null)
    theirs=$(node bench/llamacpp/greedy_llamacpp.mjs -m "$f" -p "$p" -n 32 -t 2 2>/dev/null)
    theirs=${theirs#"$p"}
    agree+=$(python3 -c 'import sys
a, b = sys.argv[1].rstrip("\n"), sys.argv[2].rstrip("\n")
n = 0
while n < min(len(a), len(b)) and a[n] == b[n]: n += 1
print("same" if a == b else f"differ at char {n}/{max(len(a), len(b))}", end="")' "$ours" "$theirs")" "
  done
  ppl_ours=$("$bin" perplexity -m "$f" -f "$text" -c 128 --threads 2 2>/dev/null | grep -oE 'PPL = [0-9.]+' | tail -1 | cut -d' ' -f3)
  ppl_theirs=$("$ll/llama-perplexity" -m "$f" -f "$text" -c 128 -t 2 2>&1 | grep -oE 'PPL = [0-9.]+' | tail -1 | cut -d' ' -f3)
  mib=$(( $(stat -c %s "$f") >> 20 ))
  echo "| $type | $mib | ${agree% } | ${ppl_ours:-?} | ${ppl_theirs:-?} |"
done
