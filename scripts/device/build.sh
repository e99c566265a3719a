#!/usr/bin/env bash
# Build on the GPU device machine, which has nvcc, CMake and ninja but no
# Debian packages and no network. The -dev packages the build needs are
# fetched here first (scripts/device/fetch_deps.sh -> .devdeps/, carried with
# the call) and unpacked into a private root, never into /.
#
#   scripts/device/build.sh [BUILD_DIR] [CUDA_ARCHS] [ninja targets...]
# BUILD_DIR defaults to build-gpu, CUDA_ARCHS to 90a (one architecture for
# quick iteration; "all" builds every architecture users have).
# MOESERVE_CMAKE_ARGS: more CMake arguments (MPI, NCCL: two_gpu.sh nccl).
set -euo pipefail
cd "$(dirname "$0")/../.."
build_dir=${1:-build-gpu}
archs=${2:-90a}
shift $(( $# > 2 ? 2 : $# )) || true
root=/tmp/devroot
if [ ! -f "$root/.done" ]; then
  mkdir -p "$root"
  for f in .devdeps/*.deb; do dpkg -x "$f" "$root"; done
  # Header trees packed by fetch_deps.sh (the machine may lack xz: Python's lzma).
  for f in .devdeps/*.tar.xz; do
    [ -f "$f" ] && python3 -c "import lzma,tarfile,sys; tarfile.open(fileobj=lzma.open(sys.argv[1])).extractall(sys.argv[2])" "$f" "$root"
  done
  touch "$root/.done"
fi
export PKG_CONFIG_SYSROOT_DIR=$root
export PKG_CONFIG_PATH=$root/usr/lib/x86_64-linux-gnu/pkgconfig:$root/usr/share/pkgconfig
export LD_LIBRARY_PATH=$root/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
arch_flag=()
if [ "$archs" != "all" ]; then arch_flag=(-DMOESERVE_CUDA_ARCHS="$archs"); fi
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMOESERVE_CUDA=ON \
  -DCMAKE_PREFIX_PATH="$root/usr" -DCMAKE_INCLUDE_PATH="$root/usr/include" \
  -DCMAKE_LIBRARY_PATH="$root/usr/lib/x86_64-linux-gnu" "${arch_flag[@]}" ${MOESERVE_CMAKE_ARGS:-} >/dev/null
ninja -C "$build_dir" "$@"
