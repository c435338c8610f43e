#!/usr/bin/env bash
# Run on the development machine, before a GPU check (README.md beside this file): copies what
# the GPU machine lacks and cannot fetch (it reaches no network) into .gpu-carry/ in the
# checkout, which git ignores and the device call carries: GoogleTest's sources (Debian's
# googletest package; built there with its own compiler, so no ABI is assumed) and Gloo's
# headers (libgloo-dev; torch's wheel ships none, and c10d's Gloo headers include them).
set -euo pipefail
cd "$(dirname "$0")/../.."
carry=.gpu-carry
for needed in /usr/src/googletest/CMakeLists.txt /usr/include/gloo/config.h /usr/include/xxhash.h; do
  [ -e "$needed" ] || { echo "gpu_check/prepare.sh: $needed is missing; apt-get install googletest libgloo-dev libxxhash-dev" >&2; exit 1; }
done
rm -rf "$carry"
mkdir -p "$carry/include"
cp -r /usr/src/googletest "$carry/googletest"
cp -r /usr/include/gloo "$carry/include/gloo"
cp /usr/include/xxhash.h "$carry/include/"  # the checkpoint checksum's XXH64, compiled in (header only)
echo "gpu_check/prepare.sh: $carry/ holds $(du -sh "$carry" | cut -f1); carry it: run(command=\"bash tools/gpu_check/run.sh\", carry=[\"$carry\"])"
