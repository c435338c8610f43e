#!/usr/bin/env bash
# cmake/SharedLibstdcxx.cmake accepts the usual compiler and refuses one that links libstdc++
# statically into shared libraries (a wrapper adding -static-libstdc++, as the GPU image's
# /opt/gcc/bin/g++ did), naming the compiler and the fix. Usage: check_libstdcxx.sh SOURCE_DIR CXX
set -euo pipefail
source_dir=$1
cxx=$2
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
cmake -S "$source_dir/tests/package/libstdcxx" -B "$scratch/usual" -DCMAKE_CXX_COMPILER="$cxx" > "$scratch/usual.log" 2>&1 ||
  { cat "$scratch/usual.log"; echo "check_libstdcxx: the usual compiler $cxx was refused" >&2; exit 1; }
printf '#!/bin/sh\nexec "%s" "$@" -static-libstdc++\n' "$cxx" > "$scratch/static-g++"
chmod +x "$scratch/static-g++"
if cmake -S "$source_dir/tests/package/libstdcxx" -B "$scratch/static" -DCMAKE_CXX_COMPILER="$scratch/static-g++" > "$scratch/static.log" 2>&1; then
  echo "check_libstdcxx: a compiler adding -static-libstdc++ was accepted" >&2; exit 1
fi
# CMake wraps the message: join its lines before looking for the compiler and the fix.
message=$(tr -s ' \n' ' ' < "$scratch/static.log")
for expected in "$scratch/static-g++" "links libstdc++ statically" "-DCMAKE_CXX_COMPILER="; do
  [[ $message == *"$expected"* ]] || { cat "$scratch/static.log"; echo "check_libstdcxx: the refusal does not say '$expected'" >&2; exit 1; }
done
echo "check_libstdcxx: $cxx accepted; a -static-libstdc++ wrapper refused, naming itself and the fix"
