#!/usr/bin/env bash
# Builds scripts/quant/llama_fixtures.c against the ggml of the llama.cpp
# release node-llama-cpp bundles (bench/llamacpp: `npm install`, then
# scripts/device/llamacpp_gpu.sh pack makes .llamasrc/llama.tar.xz) and
# writes tests/data/quant/*.bin: llama.cpp's own quantized blocks and their
# dequantized values, the fixtures of tests/tensor/llama_fixture_test.cpp.
#   scripts/quant/make_llama_fixtures.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
src=$(mktemp -d)
trap 'rm -rf "$src"' EXIT
tar -C "$src" -xJf .llamasrc/llama.tar.xz ./ggml
g=$src/ggml
sed -e 's/@[A-Z_]*@/0/g' "$g/src/ggml-version.h.in" > "$src/ggml-version.h"
cc="gcc -O2 -I$src -I$g/include -I$g/src"
$cc -c "$g/src/ggml.c" -o "$src/ggml.o"
$cc -c "$g/src/ggml-quants.c" -o "$src/ggml-quants.o"
g++ -O2 -std=c++17 -I$g/include -I$g/src -c "$g/src/ggml-threading.cpp" -o "$src/ggml-threading.o"
$cc -c scripts/quant/llama_fixtures.c -o "$src/main.o"
g++ "$src"/*.o -o "$src/llama_fixtures" -lm -lpthread
mkdir -p tests/data/quant
"$src/llama_fixtures" tests/data/quant
