#!/usr/bin/env bash
# Packs (here) what the server's end-to-end suite needs on the GPU device
# machine, which has no node and no network, into .nodedeps/ (git-ignored
# through .git/info/exclude; name .nodedeps in the device call's carry list):
# this machine's node binary and tests/server_e2e/node_modules without
# playwright-core (the web page test needs Chromium and stays on the CPU
# machine), both xz-compressed to fit the call's 64 MiB.
set -euo pipefail
cd "$(dirname "$0")/../.."
[ -d tests/server_e2e/node_modules ] || (cd tests/server_e2e && npm ci --no-audit --no-fund --loglevel=error)
mkdir -p .nodedeps
# Stripped and at xz's strongest preset (~22 MB), so that each half fits a
# call beside the tracked files (.nodeparts/a and b: paged_gpu.sh nodepart).
strip -o .nodedeps/node "$(readlink -f "$(command -v node)")"
xz -T0 -9e -c .nodedeps/node > .nodedeps/node.xz
rm .nodedeps/node
rm -rf .nodeparts
mkdir -p .nodeparts/a .nodeparts/b
split -n 2 -d .nodedeps/node.xz .nodeparts/nodepart
mv .nodeparts/nodepart00 .nodeparts/a/ && mv .nodeparts/nodepart01 .nodeparts/b/
tar -C tests/server_e2e -cJf .nodedeps/modules.tar.xz --exclude=node_modules/playwright-core node_modules
ls -la .nodedeps .nodeparts/*
