# Sourced by the device scripts (scripts/device/*.sh): the repository root as
# the working directory, $out (the call's $OUT folder), the unpacked -dev
# packages' libraries on the library path (build.sh), and where the
# binaries are:
#   - built on the device machine by build.sh into build-gpu (device_build);
#   - or built on this machine and carried: scripts/device/pack_bins.py
#     TARBALL BUILD_DIR TARGET... packs them (stripped, with the shared
#     libraries they need) under build-*/carry/, the call carries that
#     folder, and BIN_TARBALL=TARBALL makes these scripts unpack it into
#     /tmp/bins and run from there (no build: minutes of device time saved).
# Sets: out, root (the build tree: bin/, bench/, tests/), bin (moeserve).
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
out=${OUT:-/tmp/out}
mkdir -p "$out"
export LD_LIBRARY_PATH=/tmp/devroot/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
root=build-gpu
if [ -n "${BIN_TARBALL:-}" ]; then
  if [ ! -f /tmp/bins/.done ]; then
    mkdir -p /tmp/bins
    python3 -c "import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" "$BIN_TARBALL" /tmp/bins &&
      touch /tmp/bins/.done
  fi
  root=/tmp/bins
  export LD_LIBRARY_PATH=/tmp/bins/lib:$LD_LIBRARY_PATH
fi
bin=$root/bin/moeserve

# device_build LOG TARGET...: build.sh build-gpu 90a TARGET... (log in
# $out/LOG); on failure the errors, and exit. Nothing with BIN_TARBALL.
device_build() {
  local log=$1
  shift
  [ -z "${BIN_TARBALL:-}" ] || return 0
  scripts/device/build.sh build-gpu 90a "$@" > "$out/$log" 2>&1 ||
    { grep -E 'error|FAILED' -A3 "$out/$log" | head -40; exit 1; }
}
