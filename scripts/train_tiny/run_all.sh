#!/usr/bin/env bash
# Build the corpus and tokenizer, train the tiny Qwen3-MoE and dense Qwen3
# models on the GPU, and write the reference fixtures. Everything lands in
# OUTDIR (default /tmp/train_tiny_out):
#   data/            corpus manifest, token streams, tokenizer/
#   hf/<name>/       HF model directories (bf16 safetensors + tokenizer)
#   train_<arch>.json, fixtures_<arch>.json, tokenizer_cases.json, logs/
# Usage: scripts/train_tiny/run_all.sh [OUTDIR] [MOE_SECONDS] [DENSE_SECONDS]
set -u -o pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
OUTDIR="${1:-/tmp/train_tiny_out}"
MOE_SECONDS="${2:-170}"
DENSE_SECONDS="${3:-150}"
TEMPLATE="$REPO/tests/reference/templates/qwen3.jinja"
PY="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=true
mkdir -p "$OUTDIR/logs" "$OUTDIR/hf"
status=0

"$PY" -c 'import torch, transformers, tokenizers, safetensors, sys; print("python", sys.version.split()[0], "torch", torch.__version__, "transformers", transformers.__version__, "tokenizers", tokenizers.__version__, "cuda", torch.cuda.is_available() and torch.cuda.get_device_name(0))' \
  2>&1 | tee "$OUTDIR/logs/versions.log"

"$PY" "$HERE/corpus_tokenizer.py" --out "$OUTDIR/data" --template "$TEMPLATE" \
  2>&1 | tee "$OUTDIR/logs/corpus_tokenizer.log" || { echo "corpus/tokenizer failed"; exit 1; }

train() {  # arch name seconds
  "$PY" "$HERE/train_model.py" --arch "$1" --data "$OUTDIR/data" --out "$OUTDIR/hf/$2" \
    --summary "$OUTDIR/train_$1.json" --seconds "$3" 2>&1 | tee "$OUTDIR/logs/train_$1.log"
}
fixtures() {  # arch name [extra args]
  local arch="$1" name="$2"; shift 2
  "$PY" "$HERE/make_fixtures.py" --arch "$arch" --model-dir "$OUTDIR/hf/$name" --name "$name" \
    --template "$TEMPLATE" --out "$OUTDIR/fixtures_$arch.json" "$@" \
    2>&1 | tee "$OUTDIR/logs/fixtures_$arch.log"
}

train qwen3moe qwen3moe-tiny "$MOE_SECONDS" || { echo "qwen3moe training failed"; status=1; }
# The MoE fixtures run on the CPU while the dense model trains on the GPU.
fixtures qwen3moe qwen3moe-tiny --threads 8 &
moe_fix=$!
train qwen3 qwen3-tiny "$DENSE_SECONDS" || { echo "qwen3 training failed"; status=1; }
fixtures qwen3 qwen3-tiny --threads 8 --tokenizer-cases-out "$OUTDIR/tokenizer_cases.json" \
  || { echo "qwen3 fixtures failed"; status=1; }
wait "$moe_fix" || { echo "qwen3moe fixtures failed"; status=1; }
du -ab "$OUTDIR/hf" "$OUTDIR"/*.json 2>/dev/null | sort -k2
exit $status
