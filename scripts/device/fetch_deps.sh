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
# Boost: only the header trees moeserve's server includes (asio, beast and
# what they pull in) and its CMake package files, 1.5 MB instead of the
# 9.5 MB package, so that a call carrying .devdeps has room for more (the
# working tree that travels is capped at 64 MiB).
deb=$(ls libboost1.74-dev_*.deb)
tmp=$(mktemp -d)
dpkg -x "$deb" "$tmp"
top=$(for f in ../src/server/http/*.cpp ../src/server/http_server.cpp; do
        g++ -std=c++20 -M -MG \
          -isystem "$tmp/usr/include" -I../src "$f" 2>/dev/null
      done | tr ' \\' '\n\n' | sed -n "s#^$tmp/usr/include/boost/##p" | cut -d/ -f1 | sort -u)
[ -n "$top" ] || { echo "fetch_deps: no Boost headers found for the server sources" >&2; exit 1; }
(cd "$tmp" && tar cf - $(printf 'usr/include/boost/%s ' $top) usr/lib/x86_64-linux-gnu/cmake/Boost-1.74.0 \
  usr/lib/x86_64-linux-gnu/cmake/boost_headers-1.74.0 usr/lib/x86_64-linux-gnu/cmake/BoostDetectToolset-1.74.0.cmake) \
  | xz -9 > boost-headers.tar.xz
rm -rf "$tmp" "$deb"
