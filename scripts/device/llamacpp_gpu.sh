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
set -euo pipefail
cd "$(dirname "$0")/../.."
src=/tmp/llama-src
build=/tmp/llama-build
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
  build)
    if [ ! -d "$src" ]; then
      mkdir -p "$src"
      python3 -c "import lzma,tarfile,sys; tarfile.open(fileobj=lzma.open(sys.argv[1])).extractall(sys.argv[2])" \
        .llamasrc/llama.tar.xz "$src"
    fi
    [ -x "$build/bin/llama-bench" ] && { echo "built already"; exit 0; }
    [ -f /tmp/llama-build.started ] && { echo "building"; exit 0; }
    touch /tmp/llama-build.started
    setsid nohup sh -c "cmake -S $src -B $build -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
      -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_NATIVE=ON -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TESTS=OFF \
      -DLLAMA_BUILD_EXAMPLES=ON -DLLAMA_BUILD_APP=OFF -DLLAMA_OPENSSL=OFF && ninja -C $build ${LLAMA_TARGETS:-llama-bench} \
      && touch $build/.done" > /tmp/llama-build.log 2>&1 < /dev/null &
    echo "build started (log: /tmp/llama-build.log)";;
  bench)
    shift
    f=$1
    shift
    for i in $(seq 1 ${WAIT_STEPS:-100}); do [ -f "$build/.done" ] && break; sleep 5; done
    [ -f "$build/.done" ] || { echo "llama-bench is not built: $(tail -c 600 /tmp/llama-build.log)"; exit 1; }
    "$build/bin/llama-bench" -m "$f" "$@";;
  run)
    shift
    tool=$1
    shift
    for i in $(seq 1 ${WAIT_STEPS:-100}); do [ -f "$build/.done" ] && break; sleep 5; done
    [ -f "$build/.done" ] || { echo "$tool is not built: $(tail -c 600 /tmp/llama-build.log)"; exit 1; }
    "$build/bin/$tool" "$@";;
  *)
    sed -n 2,16p "$0"
    exit 2;;
esac
