#!/usr/bin/env bash
# Issue 45 on the nvidia-h200-x2 kind (two H200s of one host), in three calls
# that keep the machine warm between them:
#   scripts/device/two_gpu.sh start  # topology; build; start making the 30b-a3b file and one of twice its
#                                    # layers; train a DFlash draft for qwen3moe-tiny on GPU 1 meanwhile; the
#                                    # split and spec GPU tests; tiny models' text over two GPUs; the draft on
#                                    # cuda:1 against cuda:0
#   scripts/device/two_gpu.sh bench  # 30b-a3b unsplit vs cuda:0,cuda:1 (pp512, tg128, pp4096, boundary copy per
#                                    # step), pipelined prefill with each GPU's busy share sampled, the draft on cuda:1
#   scripts/device/two_gpu.sh big    # the 96-layer file on one GPU with --gpu-mem half of it vs split
#   scripts/device/two_gpu.sh e2e    # the server's end-to-end suite against a cuda:0,cuda:1 split (carry .nodedeps)
#   scripts/device/two_gpu.sh final  # every GPU suite (gpu_tests.sh), then pp512 / pp4096 unsplit vs split again
#   scripts/device/two_gpu.sh mpi    # OpenMPI from .mpideps (Debian's debs, carried in a call of their own:
#                                    # the tree and .devdeps fill one call), the build with MPI, then two
#                                    # ranks with a GPU each (--layer-split mpi:0:cuda:0,mpi:1:cuda:1)
#                                    # against the in-process cuda:0,cuda:1 split
#   scripts/device/two_gpu.sh mpideps  # unpack .mpideps (carried alone), then in the next calls (carry .devdeps):
#   scripts/device/two_gpu.sh nccl     # the build with MPI and NCCL (the pip package nvidia-nccl's), the split and
#                                      # shard GPU tests, tiny models' text over two ranks (NCCL and host rows)
#   scripts/device/two_gpu.sh nccl_bench  # 30b-a3b: in-process split vs two ranks with rows over NCCL vs the host
# Carry .devdeps (and .nodedeps for e2e). Logs and tables go to $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
export LD_LIBRARY_PATH=/tmp/devroot/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
# NVLink multicast stays off on these machines (the device notes say why).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
out=${OUT:-/tmp/out}
mkdir -p "$out" /tmp/2gpu
bin=build-gpu/bin/moeserve
m30=/tmp/2gpu/30b.gguf
m96=/tmp/2gpu/30b-96l.gguf
draft=/tmp/2gpu/dflash-qwen3moe
tiny=tests/data/models/qwen3moe-tiny.bf16.gguf

run_test() {  # name binary [filter]
  MOESERVE_TEST_DEVICE=cuda "$2" ${3:+--gtest_filter=$3} > "$out/$1.log" 2>&1
  echo "$1 (cuda): $(grep -E '^\[  (PASSED|FAILED)' "$out/$1.log" | tr '\n' ' ')"
  grep -E '^\[  FAILED|Failure' -A6 "$out/$1.log" | head -30
}
wait_for() {  # file
  for _ in $(seq 1 110); do [ -f "$1.done" ] && return 0; sleep 5; done
  echo "not ready: $1 ($(tail -c 300 /tmp/2gpu/make.log))"
  return 1
}
# Each GPU's busy share while `cmd` runs: nvidia-smi's utilization (the share
# of each sample period in which a kernel ran) every 100 ms, averaged over
# the samples where either GPU was busy.
busy_share() {  # tag cmd...
  local tag=$1
  shift
  nvidia-smi --query-gpu=index,utilization.gpu --format=csv,noheader,nounits -lms 100 > "$out/util_$tag.csv" &
  local smi=$!
  "$@"
  kill $smi 2>/dev/null
  wait $smi 2>/dev/null
  python3 - "$out/util_$tag.csv" "$tag" <<'PY'
import sys, collections
rows = [l.split(',') for l in open(sys.argv[1]) if l.strip()]
samples = collections.defaultdict(list)
for i, u in rows:
    samples[int(i)].append(float(u))
n = min(len(v) for v in samples.values()) if samples else 0
busy = [k for k in range(n) if any(samples[g][k] > 0 for g in samples)]
share = {g: sum(samples[g][k] for k in busy) / max(len(busy), 1) for g in sorted(samples)}
print(f"  busy share ({sys.argv[2]}, {len(busy)} samples of 100 ms with work): " +
      ", ".join(f"cuda:{g} {v:.0f}%" for g, v in share.items()))
PY
}

case "${1:-start}" in
  start)
    nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader
    nvidia-smi topo -m 2>&1 | head -6
    # The draft trains on GPU 1 while the build runs.
    (CUDA_VISIBLE_DEVICES=1 python3 scripts/train_tiny/train_dflash.py --arch qwen3moe --out $draft \
       --seconds ${DRAFT_SECONDS:-90} > "$out/train_dflash.log" 2>&1; echo $? > /tmp/2gpu/train.rc) &
    scripts/device/build.sh build-gpu 90a moeserve test_split test_spec dflash_cli_fixture > "$out/build.log" 2>&1 \
      || { grep -E 'error|FAILED' -A3 "$out/build.log" | head -40; exit 1; }
    cp "$bin" /tmp/2gpu/moeserve-mm
    if ! pgrep -f moeserve-mm >/dev/null; then
      setsid nohup sh -c "
        /tmp/2gpu/moeserve-mm make-model --arch qwen3moe --preset 30b-a3b --type q4_k_m --quick-quant --no-progress \
          --router-skew 0 -o $m30 && touch $m30.done
        /tmp/2gpu/moeserve-mm make-model --arch qwen3moe --preset 30b-a3b --layers 96 --type q4_k_m --quick-quant \
          --no-progress --router-skew 0 -o $m96 && touch $m96.done" > /tmp/2gpu/make.log 2>&1 < /dev/null &
    fi
    run_test split build-gpu/tests/split/test_split
    run_test spec build-gpu/tests/spec/test_spec 'Dflash*'
    echo "== tiny models: greedy text over two GPUs against one"
    for arch in qwen3 qwen3moe qwen35moe laguna; do
      m=tests/data/models/$arch-tiny.bf16.gguf
      want=$($bin generate -m $m -p 'def add(a, b):' -n 32 --temp 0 --device cuda 2>/dev/null | md5sum)
      for split in cuda:0,cuda:1 cuda:0=0:1,cuda:1=1:3,cuda:0=3:4 cuda:1=0:2,proc:cuda:0=2:4; do
        got=$($bin generate -m $m -p 'def add(a, b):' -n 32 --temp 0 --layer-split $split --micro-batches 4 \
          2>"$out/err_$arch.txt" | md5sum)
        [ "$got" = "$want" ] && echo "$arch $split: same text" || { echo "$arch $split: DIFFERENT"; tail -3 "$out/err_$arch.txt"; }
      done
    done
    grep -h "peer access" "$out"/err_*.txt | sort -u | head -3
    wait
    [ "$(cat /tmp/2gpu/train.rc)" = 0 ] || { tail -20 "$out/train_dflash.log"; exit 1; }
    grep -v '^step' "$out/train_dflash.log" | tail -3
    $bin convert $draft -o $draft.gguf --type bf16 2>&1 | tail -1
    echo "== qwen3moe tiny, DFlash draft (chain of 15, drafting every step): draft on cuda:0 vs cuda:1; target split"
    for where in "--device cuda" "--device cuda --device-draft cuda:1" "--layer-split cuda:0,cuda:1" \
                 "--layer-split cuda:0,cuda:1 --device-draft cuda:1"; do
      echo "-- $where"
      $bin bench -m $tiny -p 64 -n 128 -r 3 $where --spec dflash --draft $draft.gguf --spec-max 15 --spec-fixed 2>&1 \
        | tee "$out/spec_tiny_${where//[ :=,-]/_}.txt" | grep -E 'DFlash draft|^\| (code|chat)|error' | head -8
    done;;
  bench)
    wait_for $m30 || exit 1
    for split in "--device cuda" "--layer-split cuda:0,cuda:1"; do
      echo "== 30b-a3b Q4_K_M $split"
      $bin bench -m $m30 -p 512 -n 128 -r 3 $split 2>&1 | tee "$out/b30_${split//[ :=,-]/_}.txt" \
        | grep -E '\| pp[0-9]+|\| tg128|peer access|error'
      $bin bench -m $m30 -p 0 -n 64 -r 1 --profile $split 2>&1 | grep -E 'tg profile|error'
      for micro in 1 4; do
        [ "$split" = "--device cuda" ] && [ $micro = 4 ] && continue
        busy_share "30b_${split//[ :=,-]/_}_mb$micro" \
          sh -c "$bin bench -m $m30 -p 4096 -n 0 -r 4 $split --micro-batches $micro 2>&1 \
                 | tee '$out/b30_pp4096_${split//[ :=,-]/_}_$micro.txt' | grep -E '\| pp[0-9]+|error' \
                 | sed 's/^/  micro-batches $micro: /'"
      done
    done
    echo "== greedy text, 30b-a3b: unsplit vs cuda:0,cuda:1"
    a=$($bin generate -m $m30 -p 'def fibonacci(n):' -n 48 --temp 0 --device cuda 2>/dev/null | md5sum)
    b=$($bin generate -m $m30 -p 'def fibonacci(n):' -n 48 --temp 0 --layer-split cuda:0,cuda:1 2>/dev/null | md5sum)
    [ "$a" = "$b" ] && echo "same text" || echo "DIFFERENT text"
    d30=/tmp/2gpu/dflash-30b
    if [ ! -f $d30.gguf ]; then
      build-gpu/tests/cli/dflash_cli_fixture $d30 2048 48 151936 5 32 4 128 6144 \
        && $bin convert $d30 -o $d30.gguf --type bf16 2>&1 | tail -1
    fi
    for where in "" "--device-draft cuda:1"; do
      echo "== 30b-a3b, a DFlash draft of the published shape (random weights: its cost), ${where:-draft on cuda:0}"
      $bin generate -m $m30 --device cuda $where -n 64 --temp 0 --spec dflash --draft $d30.gguf \
        --spec-max 15 --spec-fixed -p "def fibonacci(n):" 2>&1 | grep -E 'speculative|decode|error'
    done
    ;;
  big)
    wait_for $m96 || exit 1
    gib=$(python3 -c "import os; print(f'{os.path.getsize(\"$m96\") / 2**30 / 2:.1f}GiB')")
    for split in "--device cuda --gpu-mem $gib" "--layer-split cuda:0,cuda:1"; do
      echo "== 30b-a3b with 96 layers, $split"
      $bin bench -m $m96 -p 512 -n 128 -r 2 $split 2>&1 | tee "$out/b96_${split//[ :=,-]/_}.txt" \
        | grep -E 'experts:|\| pp[0-9]+|\| tg128|memory|error'
      $bin bench -m $m96 -p 4096 -n 0 -r 1 $split 2>&1 | grep -E '\| pp[0-9]+|error'
    done;;
  final)
    # Every GPU suite, then the split's prefill again with the 512-row micro-batch rule.
    scripts/device/build.sh build-gpu 90a moeserve test_kernels_gpu test_models test_split test_ipc test_runtime \
      test_spec test_server > "$out/build.log" 2>&1 || { grep -E 'error|FAILED' -A3 "$out/build.log" | head -40; exit 1; }
    cp "$bin" /tmp/2gpu/moeserve-mm
    [ -f $m30.done ] || setsid nohup sh -c "/tmp/2gpu/moeserve-mm make-model --arch qwen3moe --preset 30b-a3b \
      --type q4_k_m --quick-quant --no-progress --router-skew 0 -o $m30 && touch $m30.done" > /tmp/2gpu/make.log 2>&1 < /dev/null &
    scripts/device/gpu_tests.sh 2>&1 | grep -v '^NVIDIA'
    wait_for $m30 || exit 1
    for split in "--device cuda" "--layer-split cuda:0,cuda:1"; do
      echo "== 30b-a3b Q4_K_M $split (defaults: --micro-batches 4, --micro-batch-rows 512)"
      $bin bench -m $m30 -p 512 -n 0 -r 3 $split 2>&1 | grep -E '\| pp[0-9]+|error'
      $bin bench -m $m30 -p 4096 -n 0 -r 2 $split 2>&1 | grep -E '\| pp[0-9]+|error'
    done;;
  mpi)
    root=/tmp/mpiroot
    if [ ! -f $root/.done ]; then
      mkdir -p $root && for f in .mpideps/*.deb; do dpkg -x "$f" $root; done && touch $root/.done
    fi
    # Debian's OpenMPI moved under /tmp: OPAL_PREFIX relocates its wrappers and plugins.
    export OPAL_PREFIX=$root/usr PATH=$root/usr/bin:$PATH
    export LD_LIBRARY_PATH=$root/usr/lib/x86_64-linux-gnu:$root/usr/lib/x86_64-linux-gnu/openmpi/lib:$LD_LIBRARY_PATH
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    # The image has another PMIx at the path Debian's was built for: load the carried plugins
    # (without this, its zlib plugin fails to load with a warning; the runs work either way).
    export PMIX_MCA_mca_base_component_path=$root/usr/lib/x86_64-linux-gnu/pmix2/lib/pmix
    cmake -S . -B build-gpu -DMOESERVE_MPI=ON -DMPI_CXX_COMPILER=$root/usr/bin/mpicxx.openmpi > "$out/mpi_cmake.log" 2>&1 \
      || { tail -20 "$out/mpi_cmake.log"; exit 1; }
    ninja -C build-gpu moeserve > "$out/mpi_build.log" 2>&1 || { grep -E 'error' -A3 "$out/mpi_build.log" | head -30; exit 1; }
    mpirun_=(mpirun.openmpi -np 2 --bind-to none --mca btl self,vader,tcp --mca pml ob1)
    wait_for $m30 || exit 1
    echo "== greedy text: two MPI ranks against one GPU"
    a=$($bin generate -m $m30 -p 'def fibonacci(n):' -n 48 --temp 0 --device cuda 2>/dev/null | md5sum)
    b=$("${mpirun_[@]}" $bin generate -m $m30 -p 'def fibonacci(n):' -n 48 --temp 0 \
        --layer-split mpi:0:cuda:0,mpi:1:cuda:1 2>"$out/mpi_generate.err" | md5sum)
    [ "$a" = "$b" ] && echo "same text" || { echo "DIFFERENT text"; tail -5 "$out/mpi_generate.err"; }
    for split in "--layer-split cuda:0,cuda:1" "--layer-split mpi:0:cuda:0,mpi:1:cuda:1"; do
      echo "== 30b-a3b Q4_K_M $split"
      run=()
      [[ $split == *mpi:* ]] && run=("${mpirun_[@]}")
      "${run[@]}" $bin bench -m $m30 -p 512 -n 128 -r 3 $split 2>&1 | tee "$out/mpi_${split//[ :=,-]/_}.txt" \
        | grep -E '\| pp[0-9]+|\| tg128|error|abort'
      "${run[@]}" $bin bench -m $m30 -p 4096 -n 0 -r 2 $split 2>&1 | grep -E '\| pp[0-9]+|error|abort'
    done;;
  mpideps)
    root=/tmp/mpiroot
    mkdir -p $root && for f in .mpideps/*.deb; do dpkg -x "$f" $root; done && touch $root/.done
    ls $root/usr/bin | grep -c mpi;;
  nccl|nccl_bench)
    root=/tmp/mpiroot
    [ -f $root/.done ] || { echo "run two_gpu.sh mpideps first (carry .mpideps)"; exit 1; }
    export OPAL_PREFIX=$root/usr PATH=$root/usr/bin:$PATH
    export LD_LIBRARY_PATH=$root/usr/lib/x86_64-linux-gnu:$root/usr/lib/x86_64-linux-gnu/openmpi/lib:$LD_LIBRARY_PATH
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    export PMIX_MCA_mca_base_component_path=$root/usr/lib/x86_64-linux-gnu/pmix2/lib/pmix
    nccl_root=$(python3 -c "import nvidia.nccl as n; print(list(n.__path__)[0])")
    export LD_LIBRARY_PATH=$nccl_root/lib:$LD_LIBRARY_PATH
    mpirun_=(timeout 240 mpirun.openmpi -np 2 --bind-to none --mca btl self,vader,tcp --mca pml ob1
             -x LD_LIBRARY_PATH -x MOESERVE_NCCL -x NCCL_NVLS_ENABLE)
    ranks="--layer-split mpi:0:cuda:0,mpi:1:cuda:1"
    if [ "$1" = nccl ]; then
      ls $nccl_root/include/nccl.h $nccl_root/lib
      [ -f /tmp/2gpu/build.done ] && tests=() || tests=(test_split test_ipc)
      MOESERVE_CMAKE_ARGS="-DMOESERVE_MPI=ON -DMPI_CXX_COMPILER=$root/usr/bin/mpicxx.openmpi -DMOESERVE_NCCL=ON \
        -DNCCL_ROOT=$nccl_root" scripts/device/build.sh build-gpu 90a moeserve "${tests[@]}" > "$out/build.log" 2>&1 \
        || { grep -E 'error|FAILED|NCCL' -A3 "$out/build.log" | head -40; exit 1; }
      cp "$bin" /tmp/2gpu/moeserve-mm
      [ -f $m30.done ] || pgrep -f moeserve-mm >/dev/null || setsid nohup sh -c "/tmp/2gpu/moeserve-mm make-model \
        --arch qwen3moe --preset 30b-a3b --type q4_k_m --quick-quant --no-progress --router-skew 0 -o $m30 \
        && touch $m30.done" > /tmp/2gpu/make.log 2>&1 < /dev/null &
      if [ ${#tests[@]} -gt 0 ]; then
        run_test split build-gpu/tests/split/test_split
        run_test ipc build-gpu/tests/ipc/test_ipc
        touch /tmp/2gpu/build.done
      fi
      echo "== tiny models: greedy text over two MPI ranks (rows over NCCL, then through the host) against one GPU"
      for arch in qwen3 qwen3moe qwen35moe laguna; do
        m=tests/data/models/$arch-tiny.bf16.gguf
        $bin generate -m $m -p 'def add(a, b):' -n 32 --temp 0 --device cuda 2>/dev/null > "$out/text_$arch.txt"
        for nccl in 1 0; do
          MOESERVE_NCCL=$nccl "${mpirun_[@]}" $bin generate -m $m -p 'def add(a, b):' -n 32 --temp 0 $ranks \
            2>"$out/mpi_err_${arch}_$nccl.txt" > "$out/text_${arch}_$nccl.txt"
          cmp -s "$out/text_$arch.txt" "$out/text_${arch}_$nccl.txt" && echo "$arch MOESERVE_NCCL=$nccl: same text" \
            || { echo "$arch MOESERVE_NCCL=$nccl: DIFFERENT"; diff "$out/text_$arch.txt" "$out/text_${arch}_$nccl.txt" | head -6; }
        done
      done
      grep -h "NCCL\|through the host" "$out"/mpi_err_qwen3moe_*.txt | sort -u | head -4
      exit 0
    fi
    wait_for $m30 || exit 1
    echo "== greedy text, 30b-a3b: two MPI ranks over NCCL against one GPU"
    a=$($bin generate -m $m30 -p 'def fibonacci(n):' -n 48 --temp 0 --device cuda 2>/dev/null | md5sum)
    b=$(MOESERVE_NCCL=1 "${mpirun_[@]}" $bin generate -m $m30 -p 'def fibonacci(n):' -n 48 --temp 0 $ranks \
        2>"$out/nccl_generate.err" | md5sum)
    [ "$a" = "$b" ] && echo "same text" || { echo "DIFFERENT text"; tail -5 "$out/nccl_generate.err"; }
    for how in inproc nccl host; do
      echo "== 30b-a3b Q4_K_M, $how"
      run=("${mpirun_[@]}") split=$ranks nccl=1
      [ $how = inproc ] && run=() split="--layer-split cuda:0,cuda:1"
      [ $how = host ] && nccl=0
      MOESERVE_NCCL=$nccl "${run[@]}" $bin bench -m $m30 -p 512 -n 128 -r 3 $split 2>&1 \
        | tee "$out/nccl_$how.txt" | grep -E '\| pp[0-9]+|\| tg128|error|abort'
      MOESERVE_NCCL=$nccl "${run[@]}" $bin bench -m $m30 -p 4096 -n 0 -r 2 $split 2>&1 | grep -E '\| pp[0-9]+|error|abort'
    done;;
  e2e)
    E2E_DEVICE= scripts/device/e2e_gpu.sh ${SOAK:-45} "--layer-split cuda:0,cuda:1";;
esac
