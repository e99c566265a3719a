#!/usr/bin/env bash
# Fuzz the GGUF reader with libFuzzer (clang, ASan + UBSan).
#   scripts/fuzz.sh [SECONDS]        (default 60)
# Configures build-fuzz/ with clang, builds fuzz_gguf, writes a seed corpus
# with GgufWriter, and fuzzes for SECONDS. Exits non-zero when the fuzzer
# finds a crash, leak, timeout or sanitizer report; the input that triggered
# it is left in build-fuzz/fuzz-artifacts/. The grown corpus is kept in
# build-fuzz/fuzz-corpus/gguf for the next run.
# FUZZ_JOBS sets the build parallelism (default: nproc).
set -euo pipefail

seconds=${1:-60}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=$root/build-fuzz
jobs=${FUZZ_JOBS:-$(nproc)}

CC=clang CXX=clang++ cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DMOESERVE_BUILD_FUZZ=ON -DMOESERVE_BUILD_TESTS=OFF -DMOESERVE_BUILD_BENCH=OFF -DMOESERVE_CUDA=OFF >/dev/null
ninja -C "$build" -j"$jobs" fuzz_gguf fuzz_gguf_seeds

seeds=$build/fuzz-seeds/gguf
corpus=$build/fuzz-corpus/gguf
artifacts=$build/fuzz-artifacts
rm -rf "$seeds"
mkdir -p "$seeds" "$corpus" "$artifacts"
"$build/fuzz/fuzz_gguf_seeds" "$seeds"

# -malloc_limit_mb: one allocation past this is a bug (counts from the file
# must be bounded by its size; inputs here are a few KiB).
if ! "$build/fuzz/fuzz_gguf" -max_total_time="$seconds" -max_len=16384 -malloc_limit_mb=256 -rss_limit_mb=2048 \
  -timeout=10 -dict="$root/fuzz/gguf.dict" -artifact_prefix="$artifacts/" -print_final_stats=1 \
  "$corpus" "$seeds"; then
  echo "fuzz.sh: fuzz_gguf found a problem; reproduce with: $build/fuzz/fuzz_gguf $artifacts/<crash file>" >&2
  exit 1
fi
echo "fuzz.sh: no crashes in ${seconds}s"
