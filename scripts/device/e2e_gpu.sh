#!/usr/bin/env bash
# The server's end-to-end suite (the official openai and anthropic clients,
# load, socket garbage, a shortened soak) against a GPU server on the device
# machine. Needs .nodedeps (scripts/device/fetch_node.sh, carried) and a
# build in build-gpu (scripts/device/build.sh). Logs go to $OUT.
#   scripts/device/e2e_gpu.sh [soak seconds, default 60] ["serve flags for the MoE model", e.g. "--n-cpu-moe 2"]
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/out}
mkdir -p "$out" /tmp/node/bin
export LD_LIBRARY_PATH=/tmp/devroot/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
python3 - <<'PY' || exit 1
import lzma, os, shutil, tarfile
with lzma.open('.nodedeps/node.xz') as src, open('/tmp/node/bin/node', 'wb') as dst:
    shutil.copyfileobj(src, dst)
os.chmod('/tmp/node/bin/node', 0o755)
with tarfile.open('.nodedeps/modules.tar.xz') as t:
    t.extractall('tests/server_e2e')
PY
export PATH=/tmp/node/bin:$PATH MOESERVE_BIN=$PWD/build-gpu/bin/moeserve MOESERVE_E2E_DEVICE=${E2E_DEVICE-cuda}
export MOESERVE_SOAK_SECONDS=${1:-60} MOESERVE_ARTIFACTS=/tmp/e2e-artifacts MOESERVE_E2E_MOE_ARGS=${2:-}
echo "node $(node --version), device: $($MOESERVE_BIN sysinfo 2>&1 | grep -iE 'cuda:0' | head -1)"
failed=0
for t in openai_client anthropic_client responses_client structured_output schema_corpus load socket_garbage soak; do
  node --test tests/server_e2e/$t.test.mjs > "$out/e2e_$t.log" 2>&1 || failed=1
  echo "e2e $t (gpu${2:+, $2}): $(grep -E '^# (pass|fail)' "$out/e2e_$t.log" | tr '\n' ' ')"
  grep -E '^not ok' "$out/e2e_$t.log" | head -5
done
exit $failed
