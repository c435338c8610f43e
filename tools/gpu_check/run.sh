#!/usr/bin/env bash
# Run on the GPU machine (README.md beside this file), from the checkout's root, after
# prepare.sh on the development machine: builds GoogleTest and then shardtensor against that
# machine's own torch (python3's), with NCCL, and runs the CUDA tests at world size 1 (one rank
# per GPU): every op family, redistribute and autograd on CUDA tensors over NCCL, and attention
# through the real CUDA SDPA operators (tests/cuda/cuda_test.cpp). Logs go to $OUT (the device
# tool's folder that comes back), else to gpu-check-out/. `run.sh --configure-only` stops after
# configuring (a check of the set-up on a machine without a GPU).
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-gpu-check-out}
mkdir -p "$out"
carry=$PWD/.gpu-carry
jobs=$(nproc)
{
  date -u
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || echo "nvidia-smi failed"
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available(), "devices", torch.cuda.device_count())'
  g++ --version | head -1; cmake --version | head -1
} > "$out/environment.txt" 2>&1
cat "$out/environment.txt"
[ -d "$carry/googletest" ] || { echo "gpu_check/run.sh: no $carry/googletest: run tools/gpu_check/prepare.sh here first and carry .gpu-carry" | tee -a "$out/environment.txt"; exit 1; }

step() {  # step NAME COMMAND...: runs it, its output into $out/NAME.txt, the tail on the console
  local name=$1; shift
  local start=$SECONDS
  "$@" > "$out/$name.txt" 2>&1
  local rc=$?
  echo "== $name: exit $rc in $((SECONDS - start)) s"; tail -n 25 "$out/$name.txt"
  return $rc
}

rm -rf "$carry/googletest-build" "$carry/gtest" build-gpu  # a tree configured elsewhere (another path) would not configure here
generator=(); command -v ninja > /dev/null && generator=(-G Ninja)
torch_dir=$(python3 -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')/Torch
[ -f "$torch_dir/TorchConfig.cmake" ] || { echo "gpu_check/run.sh: python3 has no torch with a CMake config (got '$torch_dir')"; exit 1; }
step googletest bash -c "cmake -S '$carry/googletest' -B '$carry/googletest-build' ${generator[*]} -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_POSITION_INDEPENDENT_CODE=ON -DCMAKE_INSTALL_PREFIX='$carry/gtest' && cmake --build '$carry/googletest-build' -j $jobs --target install" || exit 1
gtest_dir=$(dirname "$(find "$carry/gtest" -name GTestConfig.cmake | head -1)")
step configure cmake -S . -B build-gpu "${generator[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTorch_DIR="$torch_dir" \
    -DGLOO_INCLUDE_DIR="$carry/include" -DGTest_DIR="$gtest_dir" -DSHARDTENSOR_BUILD_EXAMPLES=OFF || exit 1
grep -q 'SHARDTENSOR_HAVE_NCCL=ON' "$out/configure.txt" || echo "gpu_check/run.sh: the configure log does not say NCCL is on (see configure.txt)"
[ "${1:-}" = --configure-only ] && exit 0
step build cmake --build build-gpu -j "$jobs" --target cuda_tests shardrun || exit 1
step cuda_tests env SHARDTENSOR_TIMEOUT_S=60 build-gpu/tools/shardrun/shardrun -n 1 --timeout 300 build-gpu/tests/cuda_tests
