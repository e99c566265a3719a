#!/usr/bin/env bash
# llama.cpp's own `llama-bench`, built from source with CUDA on the GPU
# device machine (no network there), for same-run comparisons.
#
# The source is the llama.cpp release that node-llama-cpp pins
# (bench/llamacpp: its package carries it as a git bundle). Its prebuilt CUDA
# binaries do not run there: their sm_90 code is PTX from a newer toolkit
# than the machine's driver (580, CUDA 13.0) can JIT ("the provided PTX was
# compiled with an unsupported toolchain"), and the CUDA 12 fallback needs
# libraries the machine lacks. So it is built there, for sm_90 only.
#
#   here:  scripts/device/llamacpp_gpu.sh pack    # .llamasrc/llama.tar.xz (6 MB, git-ignored): carry .llamasrc
#   there: scripts/device/llamacpp_gpu.sh build   # in the background (~5-10 min on 16 cores): /tmp/llama-build
#   there: scripts/device/llamacpp_gpu.sh bench FILE [llama-bench args]   # waits for the build
#   there: LLAMA_TARGETS="llama-bench llama-lookup" ... build   # also its prompt-lookup decoding example
#   there: scripts/device/llamacpp_gpu.sh run TOOL [args]   # waits for the build, runs bin/TOOL
#   there: LLAMA_SERVER=1 LLAMA_TARGETS="llama-bench llama-server" scripts/device/llamacpp_gpu.sh build
#          # also llama-server (HTTP API only: /v1/chat/completions, /completion, /health; no web UI)
#   there: scripts/device/llamacpp_gpu.sh serve FILE [llama-server args]   # waits for the build,
#          # starts bin/llama-server in the background (log /tmp/llama-server.log, pid /tmp/llama-server.pid)
#          # and returns once it listens (model loaded) or has died
#   there: LLAMA_JOBS=8 ... build   # fewer compile jobs, when other work shares the machine
#   here:  scripts/device/llamacpp_gpu.sh prep    # only extracts the source to /tmp/llama-src, with the stub
#
# `pack` leaves out tools/ui (the bundle has it: 8 MB of web UI sources that its CMake builds with npm
# or downloads from Hugging Face), but with LLAMA_BUILD_SERVER=ON tools/CMakeLists.txt adds tools/ui,
# and llama-server links its `llama-ui` library (ui.h: llama_ui_asset, llama_ui_find_asset,
# llama_ui_use_gzip, llama_ui_get_assets) and depends on its `llama-ui-assets` target. `prep` writes
# a stub of those with no assets (LLAMA_UI_HAS_ASSETS undefined): the server registers no UI routes.
set -euo pipefail
cd "$(dirname "$0")/../.."
src=/tmp/llama-src
build=/tmp/llama-build
# Extracts .llamasrc/llama.tar.xz to $src (once) and stubs tools/ui there when it is missing.
prep() {
  if [ ! -d "$src" ]; then
    mkdir -p "$src"
    python3 -c "import lzma,tarfile,sys; tarfile.open(fileobj=lzma.open(sys.argv[1])).extractall(sys.argv[2])" \
      .llamasrc/llama.tar.xz "$src"
  fi
  [ -f "$src/tools/ui/CMakeLists.txt" ] && return 0
  mkdir -p "$src/tools/ui"
  cat > "$src/tools/ui/CMakeLists.txt" <<'EOF'
# Stub from moeserve's scripts/device/llamacpp_gpu.sh: llama-server without its web UI.
add_custom_target(llama-ui-assets)
add_library(llama-ui STATIC ui.cpp)
set_target_properties(llama-ui PROPERTIES POSITION_INDEPENDENT_CODE ON)
target_compile_features(llama-ui PRIVATE cxx_std_17)
target_include_directories(llama-ui PUBLIC ${CMAKE_CURRENT_SOURCE_DIR})
EOF
  cat > "$src/tools/ui/ui.h" <<'EOF'
// Stub from moeserve's scripts/device/llamacpp_gpu.sh: no embedded UI assets
// (LLAMA_UI_HAS_ASSETS stays undefined, so llama-server serves the API only).
#pragma once
#include <array>
#include <cstddef>
#include <string>
struct llama_ui_asset {
    std::string           name;
    const unsigned char * data;
    std::size_t           size;
    std::string           etag;
    std::string           type;
};
const llama_ui_asset * llama_ui_find_asset(const std::string & name);
bool llama_ui_use_gzip();
const std::array<llama_ui_asset, 0> & llama_ui_get_assets();
EOF
  cat > "$src/tools/ui/ui.cpp" <<'EOF'
// Stub from moeserve's scripts/device/llamacpp_gpu.sh.
#include "ui.h"
const llama_ui_asset * llama_ui_find_asset(const std::string &) { return nullptr; }
bool llama_ui_use_gzip() { return false; }
const std::array<llama_ui_asset, 0> & llama_ui_get_assets() {
    static const std::array<llama_ui_asset, 0> none{};
    return none;
}
EOF
}
# Waits (WAIT_STEPS x 5 s) for the background build, then checks that bin/$1 is there.
wait_built() {
  for i in $(seq 1 ${WAIT_STEPS:-100}); do [ -f "$build/.done" ] && break; sleep 5; done
  [ -f "$build/.done" ] || { echo "$1 is not built: $(tail -c 600 /tmp/llama-build.log)"; exit 1; }
  [ -x "$build/bin/$1" ] || { echo "$1 is not among the built targets (LLAMA_TARGETS, LLAMA_SERVER=1)"; exit 1; }
}
case "${1:-}" in
  pack)
    bundle=bench/llamacpp/node_modules/node-llama-cpp/llama/gitRelease.bundle
    [ -f "$bundle" ] || (cd bench/llamacpp && npm install --ignore-scripts --no-audit --no-fund)
    tmp=$(mktemp -d)
    git clone -q "$bundle" "$tmp/llama.cpp"
    mkdir -p .llamasrc
    # What a CUDA build of llama-bench compiles (no models, docs or web UI).
    tar -C "$tmp/llama.cpp" -cf - --exclude=./.git --exclude=./models --exclude=./docs --exclude=./media \
      --exclude=./tools/ui --exclude='*.png' --exclude='*.jpg' . | xz -T0 -6 > .llamasrc/llama.tar.xz
    rm -rf "$tmp"
    ls -la .llamasrc;;
  prep)
    prep
    echo "source ready: $src";;
  build)
    prep
    targets=${LLAMA_TARGETS:-llama-bench}
    server=OFF
    if [ "${LLAMA_SERVER:-0}" = 1 ]; then
      server=ON
      case " $targets " in *" llama-server "*) ;; *) targets="$targets llama-server";; esac
    fi
    missing=
    for t in $targets; do [ -x "$build/bin/$t" ] || missing="$missing $t"; done
    [ -z "$missing" ] && { echo "built already"; exit 0; }
    # A finished build of other targets: build again (same folder, so only what is new compiles).
    [ -f "$build/.done" ] && rm -f "$build/.done" /tmp/llama-build.started
    [ -f /tmp/llama-build.started ] && { echo "building"; exit 0; }
    touch /tmp/llama-build.started
    setsid nohup sh -c "cmake -S $src -B $build -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
      -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_NATIVE=ON -DLLAMA_BUILD_SERVER=$server -DLLAMA_BUILD_TESTS=OFF \
      -DLLAMA_BUILD_EXAMPLES=ON -DLLAMA_BUILD_APP=OFF -DLLAMA_OPENSSL=OFF && ninja -C $build ${LLAMA_JOBS:+-j $LLAMA_JOBS} $targets \
      && touch $build/.done" > /tmp/llama-build.log 2>&1 < /dev/null &
    echo "build of$missing started (log: /tmp/llama-build.log)";;
  bench)
    shift
    f=$1
    shift
    wait_built llama-bench
    "$build/bin/llama-bench" -m "$f" "$@";;
  run)
    shift
    tool=$1
    shift
    wait_built "$tool"
    "$build/bin/$tool" "$@";;
  serve)
    shift
    f=$1
    shift
    wait_built llama-server
    log=/tmp/llama-server.log
    setsid nohup "$build/bin/llama-server" -m "$f" "$@" > "$log" 2>&1 < /dev/null &
    pid=$!
    echo "$pid" > /tmp/llama-server.pid
    # It prints "listening on ..." once the model is loaded and the port is bound.
    for i in $(seq 1 ${SERVE_WAIT:-300}); do
      grep -q "listening on" "$log" && break
      kill -0 "$pid" 2> /dev/null || { echo "llama-server exited: $(tail -c 1500 "$log")"; exit 1; }
      sleep 1
    done
    grep -q "listening on" "$log" || { echo "llama-server (pid $pid) is not listening yet: $(tail -c 600 "$log")"; exit 1; }
    echo "llama-server pid $pid: $(grep -m1 "listening on" "$log") (log: $log; stop: kill $pid)";;
  *)
    awk 'NR > 1 { if (!/^#/) exit; print }' "$0"
    exit 2;;
esac
