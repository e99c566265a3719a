#!/usr/bin/env bash
# Fuzz the GGUF and safetensors readers with libFuzzer (clang, ASan + UBSan).
#   scripts/fuzz.sh [SECONDS]        (default 60, split evenly between them)
# Configures build-fuzz/ with clang, builds fuzz_gguf and fuzz_safetensors,
# writes seed corpora (GgufWriter; a few safetensors files written here), and
# fuzzes each for SECONDS/2. Exits non-zero when a fuzzer finds a crash,
# leak, timeout or sanitizer report; the input that triggered it is left in
# build-fuzz/fuzz-artifacts/. The grown corpora are kept in
# build-fuzz/fuzz-corpus/{gguf,safetensors} for the next run.
# FUZZ_JOBS sets the build parallelism (default: nproc).
set -euo pipefail

seconds=${1:-60}
per_target=$(( seconds / 2 > 0 ? seconds / 2 : 1 ))
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=$root/build-fuzz
jobs=${FUZZ_JOBS:-$(nproc)}

CC=clang CXX=clang++ cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DMOESERVE_BUILD_FUZZ=ON -DMOESERVE_BUILD_TESTS=OFF -DMOESERVE_BUILD_BENCH=OFF -DMOESERVE_CUDA=OFF >/dev/null
ninja -C "$build" -j"$jobs" fuzz_gguf fuzz_gguf_seeds fuzz_safetensors

seeds=$build/fuzz-seeds/gguf
corpus=$build/fuzz-corpus/gguf
artifacts=$build/fuzz-artifacts
rm -rf "$seeds"
mkdir -p "$seeds" "$corpus" "$artifacts"
"$build/fuzz/fuzz_gguf_seeds" "$seeds"

# -malloc_limit_mb: one allocation past this is a bug (counts from the file
# must be bounded by its size; inputs here are a few KiB).
if ! "$build/fuzz/fuzz_gguf" -max_total_time="$per_target" -max_len=16384 -malloc_limit_mb=256 -rss_limit_mb=2048 \
  -timeout=10 -dict="$root/fuzz/gguf.dict" -artifact_prefix="$artifacts/" -print_final_stats=1 \
  "$corpus" "$seeds"; then
  echo "fuzz.sh: fuzz_gguf found a problem; reproduce with: $build/fuzz/fuzz_gguf $artifacts/<crash file>" >&2
  exit 1
fi

# Safetensors seeds: u64 LE header length + JSON header + data.
st_seeds=$build/fuzz-seeds/safetensors
st_corpus=$build/fuzz-corpus/safetensors
rm -rf "$st_seeds"
mkdir -p "$st_seeds" "$st_corpus"
write_st_seed() {  # NAME HEADER DATA_BYTES
  local len=${#2} le="" i
  for i in 0 1 2 3 4 5 6 7; do le+=$(printf '\\x%02x' $(( (len >> (8 * i)) & 255 ))); done
  { printf "$le"; printf '%s' "$2"; head -c "$3" /dev/zero; } >"$st_seeds/$1"
}
write_st_seed one '{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}' 8
write_st_seed meta '{"__metadata__":{"format":"pt"},"a":{"dtype":"BF16","shape":[2,2],"data_offsets":[0,8]},"b":{"dtype":"F16","shape":[1],"data_offsets":[8,10]}}' 10
write_st_seed empty '{}' 0
st_dict=$build/fuzz-seeds/safetensors.dict
printf '%s\n' '"\"dtype\""' '"\"shape\""' '"\"data_offsets\""' '"\"__metadata__\""' '"\"F32\""' '"\"BF16\""' \
  '"\"F16\""' '"\"I64\""' '"18446744073709551615"' '"-1"' >"$st_dict"
if ! "$build/fuzz/fuzz_safetensors" -max_total_time="$per_target" -max_len=4096 -malloc_limit_mb=256 -rss_limit_mb=2048 \
  -timeout=10 -dict="$st_dict" -artifact_prefix="$artifacts/" -print_final_stats=1 "$st_corpus" "$st_seeds"; then
  echo "fuzz.sh: fuzz_safetensors found a problem; reproduce with: $build/fuzz/fuzz_safetensors $artifacts/<crash file>" >&2
  exit 1
fi
echo "fuzz.sh: no crashes in ${seconds}s"
