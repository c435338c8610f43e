#!/usr/bin/env bash
# Runs the dispatch, tensor-parallel MLP and redistribute benchmarks on both torch lines, one
# line after the other ("Torch lines side by side" in `git show 655ea7b:bench/RESULTS.md`). Builds both first.
# Usage: bench/run_both_lines.sh > bench_lines.log
set -euo pipefail
cd "$(dirname "$0")/.."
TORCH_LINE=debian ./dev.sh build > /dev/null
TORCH_LINE=wheel ./dev.sh build > /dev/null
for b in build build-torch2; do
  run="$b/tools/shardrun/shardrun"
  echo "=== $b dispatch n1"; "$run" -n 1 "$b/bench/dispatch_bench"
  echo "=== $b dispatch n4"; "$run" -n 4 "$b/bench/dispatch_bench"
  echo "=== $b tp_mlp n2"; "$run" -n 2 "$b/bench/tp_mlp_bench"
  echo "=== $b tp_mlp n4"; "$run" -n 4 "$b/bench/tp_mlp_bench"
done
for b in build build-torch2; do
  run="$b/tools/shardrun/shardrun"
  echo "=== $b redistribute n4"; "$run" -n 4 "$b/bench/redistribute_bench"
  echo "=== $b redistribute n2"; "$run" -n 2 "$b/bench/redistribute_bench"
done
