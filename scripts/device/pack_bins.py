#!/usr/bin/env python3
"""Packs binaries built here for a device call (scripts/device/common.sh).

  scripts/device/pack_bins.py build-sm90/carry/bins.tar.xz build-sm90 bin/moeserve \\
      tests/kernels_gpu/test_kernels_gpu bench/cuda/matvec_bench

Each TARGET (a path inside BUILD_DIR) goes into the tarball at the same
path, stripped; the shared libraries they load (ldd), except the C library's
own and the CUDA driver's, go under lib/. xz at its strongest preset: a
call carries at most 64 MiB with the tracked files, and the fat binaries'
repeated device code compresses well with a large dictionary (the GPU
kernel tests, matvec_bench and moeserve: ~9 MB).
"""
import lzma
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile

SKIP = ("libc.so", "libm.so", "libgcc_s", "linux-vdso", "ld-linux", "libpthread", "libdl.so", "librt.so",
        "libcuda.so")


def shared_libraries(path):
    libs = {}
    for line in subprocess.run(["ldd", path], capture_output=True, text=True, check=True).stdout.splitlines():
        parts = line.split()
        if "=>" in parts and len(parts) >= 3 and parts[2].startswith("/"):
            if not any(s in parts[0] for s in SKIP):
                libs[parts[0]] = parts[2]
    return libs


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    out, build_dir, targets = sys.argv[1], sys.argv[2], sys.argv[3:]
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    libs = {}
    with tempfile.TemporaryDirectory() as tmp, \
            tarfile.open(out, "w:xz", preset=9 | lzma.PRESET_EXTREME) as tar:
        for target in targets:
            src = os.path.join(build_dir, target)
            stripped = os.path.join(tmp, os.path.basename(target))
            shutil.copy(src, stripped)
            subprocess.run(["strip", stripped], check=True)
            tar.add(stripped, target)
            libs.update(shared_libraries(src))
        for name, path in sorted(libs.items()):
            tar.add(path, "lib/" + name)
    print(f"{out}: {os.path.getsize(out) / 1e6:.1f} MB ({len(targets)} binaries, {len(libs)} libraries)")


if __name__ == "__main__":
    main()
