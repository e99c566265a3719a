#!/usr/bin/env bash
# Plain vs speculative greedy on a 30b-a3b stand-in: which setting makes them differ?
set -u
export LD_LIBRARY_PATH=/tmp/devroot/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
b=build-gpu/bin/moeserve
m=/tmp/m8.gguf
[ -f $m ] || $b make-model --arch qwen3moe --preset 30b-a3b --layers 8 --type q4_k_m --quick-quant -o $m > /tmp/mk.log 2>&1
p=$'def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef add(a, b):\n'
for env in "" "MOESERVE_CUDA_GRAPHS=0" "MOESERVE_CUDA_EXPERT_DECODE=tc" "MOESERVE_CUDA_PDL=0"; do
  plain1=$(env $env $b generate -m $m --device cuda -n 96 --temp 0 -p "$p" 2>/dev/null | md5sum | cut -c1-8)
  plain2=$(env $env $b generate -m $m --device cuda -n 96 --temp 0 -p "$p" 2>/dev/null | md5sum | cut -c1-8)
  for s in "--spec ngram --spec-fixed --spec-max 2" "--spec ngram --spec-fixed --spec-max 8" "--spec ngram --spec-fixed --spec-max 8 --spec-tree 12"; do
    out=$(env $env $b generate -m $m --device cuda -n 96 --temp 0 -p "$p" $s 2>/tmp/err | md5sum | cut -c1-8)
    echo "[$env] plain $plain1 $plain2 | $s -> $out $(grep -o 'accepted ([0-9.]*%)' /tmp/err)"
  done
done
# Where they part: tokens of plain and spec-max 8.
$b generate -m $m --device cuda -n 96 --temp 0 -p "$p" 2>/dev/null > /tmp/plain.txt
$b generate -m $m --device cuda -n 96 --temp 0 -p "$p" --spec ngram --spec-fixed --spec-max 8 2>/dev/null > /tmp/spec.txt
cmp /tmp/plain.txt /tmp/spec.txt | head -2
