#!/usr/bin/env bash
# Downloads (here, where Debian's archive is reachable) the -dev packages a
# build on the GPU device machine needs into .devdeps/ (git-ignored through
# .git/info/exclude); name .devdeps in the device call's carry list.
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .devdeps
cd .devdeps
apt-get download libfmt-dev libfmt9 nlohmann-json3-dev libcli11-dev libpcre2-dev libpcre2-8-0 \
  libpcre2-16-0 libpcre2-32-0 libpcre2-posix3 libgtest-dev libgmock-dev libbenchmark-dev libbenchmark1debian \
  libboost1.74-dev
