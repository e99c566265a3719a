#!/usr/bin/env bash
# moeserve set-up, step 1 of 2 (fresh Debian 12): install every build and test
# dependency by package name, install the JavaScript reference packages used
# by the tests, then configure and build a Release tree in ./build.
#
# CUDA is optional: when nvcc is found (PATH or /usr/local/cuda) the CUDA
# kernels are built too; otherwise the CPU engine is built alone.
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

packages=(
  build-essential cmake ninja-build pkg-config git
  clang libclang-rt-14-dev            # libFuzzer + sanitizer runtimes
  libfmt-dev nlohmann-json3-dev libcli11-dev libpcre2-dev
  libboost-dev                        # Boost.Asio + Boost.Beast (header-only): the HTTP front end
  libgtest-dev libgmock-dev libbenchmark-dev
  libopenmpi-dev openmpi-bin curl     # layer shards on MPI ranks (optional in the build; tested in CI)
  chromium                            # headless browser of the web page e2e test
)
# Node.js (for the reference tests): Debian's nodejs+npm unless one is present.
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  packages+=(nodejs npm)
fi

echo "==> apt-get install ${packages[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${packages[@]}" >/dev/null

echo "==> npm ci (tests/reference: tokenizer and chat-template references)"
(cd tests/reference && npm ci --no-audit --no-fund --loglevel=error)

echo "==> npm ci (tests/server_e2e: openai client, playwright-core)"
(cd tests/server_e2e && npm ci --no-audit --no-fund --loglevel=error)

echo "==> configure + build (Release) in ./build"
# MOESERVE_CUDA_ARCHS (e.g. "90a" for an H100 only) narrows the GPU
# architectures the CUDA kernels are compiled for (default: every one users have).
arch_flag=()
if [ -n "${MOESERVE_CUDA_ARCHS:-}" ]; then arch_flag=(-DMOESERVE_CUDA_ARCHS="$MOESERVE_CUDA_ARCHS"); fi
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "${arch_flag[@]}"
cmake --build build -j"$(nproc)"
echo "==> built: build/bin/moeserve"
