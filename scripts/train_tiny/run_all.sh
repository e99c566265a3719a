#!/usr/bin/env bash
# Build the corpus and tokenizer, train tiny models on the GPU (by default the
# Qwen3-MoE and the dense Qwen3), and write the reference fixtures. Everything
# lands in OUTDIR (default /tmp/train_tiny_out):
#   data/            corpus manifest, token streams, tokenizer/
#   hf/<arch>-tiny/  HF model directories (bf16 safetensors + tokenizer)
#   train_<arch>.json, fixtures_<arch>.json, tokenizer_cases.json, logs/
# Usage: scripts/train_tiny/run_all.sh [OUTDIR] [MOE_SECONDS] [DENSE_SECONDS] [ARCHES]
# ARCHES (4th argument, else the ARCHES environment variable, default
# "qwen3moe qwen3") lists the archs to train, in order, from qwen3moe, qwen3,
# qwen35moe, qwen35, laguna; the MoE archs (*moe and laguna) train for
# MOE_SECONDS, the others for DENSE_SECONDS. Each arch's fixtures run on the
# CPU while the next arch trains; the last arch's fixtures also write
# tokenizer_cases.json.
#   ARCHES="qwen35moe qwen35" scripts/train_tiny/run_all.sh /tmp/tt 150 150
#   ARCHES=laguna scripts/train_tiny/run_all.sh /tmp/tt 150 150
set -u -o pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
OUTDIR="${1:-/tmp/train_tiny_out}"
MOE_SECONDS="${2:-170}"
DENSE_SECONDS="${3:-150}"
read -r -a ARCH_LIST <<< "${4:-${ARCHES:-qwen3moe qwen3}}"
if [ "${#ARCH_LIST[@]}" -eq 0 ]; then echo "no archs given"; exit 2; fi
for arch in "${ARCH_LIST[@]}"; do
  case "$arch" in
    qwen3moe|qwen3|qwen35moe|qwen35|laguna) ;;
    *) echo "unknown arch '$arch' (known: qwen3moe qwen3 qwen35moe qwen35 laguna)"; exit 2 ;;
  esac
done
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

# With the default archs: train qwen3moe; its fixtures run on the CPU while the
# dense qwen3 trains on the GPU; then the qwen3 fixtures (and tokenizer cases).
bg_pids=()
bg_archs=()
last=$(( ${#ARCH_LIST[@]} - 1 ))
for i in "${!ARCH_LIST[@]}"; do
  arch="${ARCH_LIST[$i]}"
  case "$arch" in *moe|laguna) seconds="$MOE_SECONDS" ;; *) seconds="$DENSE_SECONDS" ;; esac
  train "$arch" "$arch-tiny" "$seconds" || { echo "$arch training failed"; status=1; }
  if [ "$i" -lt "$last" ]; then
    fixtures "$arch" "$arch-tiny" --threads 8 &
    bg_pids+=("$!")
    bg_archs+=("$arch")
  else
    fixtures "$arch" "$arch-tiny" --threads 8 --tokenizer-cases-out "$OUTDIR/tokenizer_cases.json" \
      || { echo "$arch fixtures failed"; status=1; }
  fi
done
for j in "${!bg_pids[@]}"; do
  wait "${bg_pids[$j]}" || { echo "${bg_archs[$j]} fixtures failed"; status=1; }
done
du -ab "$OUTDIR/hf" "$OUTDIR"/*.json 2>/dev/null | sort -k2
exit $status
