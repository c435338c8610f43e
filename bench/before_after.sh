#!/usr/bin/env bash
# Times benchmarks on an earlier commit and on this checkout, interleaved, in one run: the
# "same run, before and after" that an issue's bars ask for. Each benchmark key of
# bench/regenerate.py runs on the earlier tree, then on this one, before the next key starts,
# so that a drift of the machine hits both sides alike; bench/compare_tables.py then prints
# the medians side by side with their ratio.
#
#   bench/before_after.sh REV [KEYS]     KEYS: comma-separated regenerate.py keys
#                                        (default dispatch,redistribute,halo,tp_block),
#                                        plus "perop": python_bench.py's per-op section, twice
#
# The earlier tree is a git worktree in $BEFORE_DIR (default /tmp/shardtensor-before), built
# with this checkout's .venv torch into its own build/; its Python package is assembled in
# $BEFORE_DIR/pkg and found through PYTHONPATH. Build this checkout first (./dev.sh bench does,
# or make the bench targets in build-torch2/ and ./dev.sh python). Tables go to $OUT (default
# /tmp/shardtensor-before-after).
set -euo pipefail
cd "$(dirname "$0")/.."
REV=${1:?usage: bench/before_after.sh REV [KEYS]}
KEYS=${2:-dispatch,redistribute,halo,tp_block,perop}
BEFORE_DIR=${BEFORE_DIR:-/tmp/shardtensor-before}
OUT=${OUT:-/tmp/shardtensor-before-after}
HERE=$PWD
PY=$HERE/.venv/bin/python
mkdir -p "$OUT"

if [ ! -d "$BEFORE_DIR/.git" ] && [ ! -f "$BEFORE_DIR/.git" ]; then git worktree add -f "$BEFORE_DIR" "$REV"; fi
git -C "$BEFORE_DIR" checkout -q --detach "$REV"
torch_dir=$("$PY" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')/Torch
cmake -S "$BEFORE_DIR" -B "$BEFORE_DIR/build" -DCMAKE_BUILD_TYPE=Release -DSHARDTENSOR_PYTHON=ON -DSHARDTENSOR_BUILD_TESTS=ON \
  -DSHARDTENSOR_BUILD_EXAMPLES=OFF -DSHARDTENSOR_BUILD_BENCHMARKS=ON -DPython_EXECUTABLE="$PY" -DTorch_DIR="$torch_dir" > "$OUT/before_cmake.log"
cmake --build "$BEFORE_DIR/build" -j2 --target redistribute_bench halo_conv_bench dispatch_bench attention_bench \
  shardtensor_python shardrun > "$OUT/before_build.log"
# The earlier package: its Python sources, its extension and library, its launcher.
pkg=$BEFORE_DIR/pkg/shardtensor
rm -rf "$BEFORE_DIR/pkg" && mkdir -p "$pkg/bin"
cp -r "$BEFORE_DIR/python/shardtensor/." "$pkg/"
cp "$BEFORE_DIR"/build/python/_C*.so "$pkg/" && cp -P "$BEFORE_DIR"/build/src/libshardtensor.so* "$pkg/"
cp "$BEFORE_DIR/build/tools/shardrun/shardrun" "$pkg/bin/"

before() { (cd "$BEFORE_DIR" && PYTHONPATH="$BEFORE_DIR/pkg" "$@"); }
for key in ${KEYS//,/ }; do
  if [ "$key" = perop ]; then
    for i in 1 2; do
      # This checkout's script on both sides: the same harness, the earlier package.
      before "$pkg/bin/shardrun" -n 2 --timeout 500 "$PY" "$HERE/bench/python_bench.py" --sections 1 --cxx none --cxx-dispatch none \
        > "$OUT/before_perop_$i.log" 2>&1
      .venv/bin/shardrun -n 2 --timeout 500 "$PY" bench/python_bench.py --sections 1 --cxx none --cxx-dispatch none \
        > "$OUT/after_perop_$i.log" 2>&1
    done
  else
    before "$PY" bench/regenerate.py --build-dir build --only "$key" --out "$OUT/before_$key.md" > "$OUT/before_$key.log" 2>&1
    "$PY" bench/regenerate.py --build-dir build-torch2 --only "$key" --out "$OUT/after_$key.md" > "$OUT/after_$key.log" 2>&1
  fi
  echo "before_after.sh: $key done"
done
"$PY" bench/compare_tables.py "$OUT"
