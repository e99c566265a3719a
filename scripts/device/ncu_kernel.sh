#!/usr/bin/env bash
# Nsight Compute sections (speed of light, occupancy, warp stalls, memory)
# of the decode expert products and two dense products at one token, from
# the matvec micro-benchmark.  scripts/device/ncu_kernel.sh [build|nobuild]
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/out}
mkdir -p "$out"
export LD_LIBRARY_PATH=/tmp/devroot/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
if [ "${1:-build}" = build ]; then
  scripts/device/build.sh build-gpu 90a matvec_bench > "$out/build_ncu.log" 2>&1 || { tail -20 "$out/build_ncu.log"; exit 1; }
fi
bench=$(find build-gpu -name matvec_bench -type f | head -1)
sections="--section SpeedOfLight --section Occupancy --section WarpStateStats --section MemoryWorkloadAnalysis --section LaunchStats"
for spec in "warp_mv_kernel:experts Q4_K Q6_K 1" "tc_kernel:experts Q4_K Q6_K 1:MOESERVE_CUDA_EXPERT_MV=tc" \
            "mv_kernel:Q4_K 4096 2048 1" "f32_rows_kernel:F32 128 2048 1"; do
  IFS=: read -r kernel args envs <<< "$spec"
  echo "===== $kernel ($args) $envs"
  env $envs ncu --clock-control none --kernel-name "regex:$kernel" --launch-skip 4 --launch-count 1 $sections \
    $bench $args 2> /dev/null | grep -vE "^==PROF==|^\s*$|----" | grep -E "Duration|Throughput|Occupancy|Registers|Warp Cycles|Stall|Issued|Eligible|Active Warps|Block Size|Grid Size|Waves|L1|L2|Mem|Dram|DRAM|No Eligible|Shared" | head -40
done
