#!/usr/bin/env bash
# Where a verify forward of a few rows loses time between its kernels: the
# verify cost curve with and without CUDA graphs, then an Nsight Systems
# trace (graph nodes traced) of the curve, cut into forwards at the host's
# gaps, with each forward's span, its kernels' busy time and the largest
# gaps inside it (scripts/device/trace_gaps.py).
#   scripts/device/verify_gaps.sh [preset] [type] [build|nobuild]
set -uo pipefail
source "$(dirname "$0")/common.sh"
preset=${1:-small}
type=${2:-q4_k_m}
[ "${3:-build}" != build ] || device_build build_gaps.log moeserve
model=${MODEL:-/tmp/$preset-l8.$type.gguf}
[ -f $model ] || $bin make-model --arch qwen3moe --preset $preset --layers 8 --type $type --quick-quant \
  --router-skew 0 -o $model --no-progress > /dev/null
for graphs in 1 0; do
  echo "== MOESERVE_CUDA_GRAPHS=$graphs"
  MOESERVE_CUDA_GRAPHS=$graphs $bin bench -m $model -p 0 -n 16 -r 1 --device cuda --spec ngram 2>&1 \
    | sed -n '/verify cost/,/x decode/p'
done | tee "$out/verify_curve_$preset.txt"
nsys=$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -1)
[ -n "$nsys" ] || { echo "no nsys on this machine"; exit 0; }
rm -f /tmp/gaps.nsys-rep /tmp/gaps.sqlite
$nsys profile --cuda-graph-trace=node -t cuda -o /tmp/gaps $bin bench -m $model -p 0 -n 16 -r 1 --device cuda \
  --spec ngram > /tmp/gaps_run.log 2>&1 || { tail -5 /tmp/gaps_run.log; exit 1; }
$nsys stats -q -r cuda_gpu_trace -f csv -o /tmp/gaps /tmp/gaps.nsys-rep > /dev/null 2>&1
csv=$(ls /tmp/gaps*cuda_gpu_trace*.csv | head -1)
python3 scripts/device/trace_gaps.py "$csv" --last 80 --detail "$out/verify_gaps_detail_$preset.txt" | tee "$out/verify_gaps_$preset.txt"
