#!/usr/bin/env bash
# Issue 43's CPU decode speed per weight type on the device machine's host
# (16 cores, DRAM near 100 GB/s): the matrix x vector kernels' GB/s of weight
# bytes streamed from DRAM (bench_kernels rotates over 1 GiB of copies),
# one thread and all cores, and the host's plain read bandwidth beside them.
#   scripts/device/cpu_types.sh [types regex]
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/out}
mkdir -p "$out"
export LD_LIBRARY_PATH=/tmp/devroot/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
types=${1:-'q4_K|q4_K_packed|q6_K|q8_0|q4_0|q4_1|q5_0|q5_1|q2_K|q3_K|q5_K|iq4_nl|iq4_xs|mxfp4|iq2_xxs|iq2_xs|iq2_s|iq3_xxs|iq3_s|iq1_s|iq1_m'}
scripts/device/build.sh build-gpu 90a bench_kernels > "$out/build_cpu_types.log" 2>&1 || { tail -30 "$out/build_cpu_types.log"; exit 1; }
lscpu | grep -E 'Model name|^CPU\(s\)|Thread|Flags' | cut -c1-160
build-gpu/bench/bench_kernels --benchmark_filter="^(read/1024MiB|matvec/($types))/threads:" \
  --benchmark_min_time=${MIN_TIME:-0.3} --benchmark_repetitions=2 --benchmark_report_aggregates_only=false 2>&1 \
  | grep -E 'real_time |simd_level|physical_cores|features' | tee "$out/cpu_types.txt"
