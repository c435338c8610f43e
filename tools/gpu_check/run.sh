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
  echo "CXX=${CXX:-unset}: $(${CXX:-c++} --version | head -1); its libstdc++.so: $(${CXX:-c++} -print-file-name=libstdc++.so)"
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

# The frames fault_stack.c printed, each with its function and source line where the module
# has them: "module(+0xoffset)" frames through addr2line, named ones through c++filt.
resolve_frames() {
  sed -n '/^fault_stack:/,$p' "$1" | while IFS= read -r line; do
    if [[ $line =~ ^(/[^\(]+)\((\+0x[0-9a-f]+)\) ]]; then
      echo "$line  ->  $(addr2line -f -C -i -p -e "${BASH_REMATCH[1]}" "${BASH_REMATCH[2]}" 2>/dev/null | tr '\n' ' ')"
    else
      echo "$line" | c++filt
    fi
  done
}

rm -rf "$carry/googletest-build" "$carry/gtest" build-gpu  # a tree configured elsewhere (another path) would not configure here
generator=(); command -v ninja > /dev/null && generator=(-G Ninja)
torch_dir=$(python3 -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')/Torch
[ -f "$torch_dir/TorchConfig.cmake" ] || { echo "gpu_check/run.sh: python3 has no torch with a CMake config (got '$torch_dir')"; exit 1; }
# The compiler: $CXX, unless it links libstdc++ statically into shared libraries (the image seen
# on 2026-11-27 set CXX=/opt/gcc/bin/g++, and libshardtensor then crashed in Python in its first
# ostream output). cmake/SharedLibstdcxx.cmake refuses such a compiler at configure time; a
# configure without the tests (seconds) asks it, and on its refusal the PATH's g++ builds all.
step compiler_check cmake -S . -B build-gpu-compiler-check "${generator[@]}" -DTorch_DIR="$torch_dir" \
    -DGLOO_INCLUDE_DIR="$carry/include" -DSHARDTENSOR_BUILD_TESTS=OFF -DSHARDTENSOR_BUILD_EXAMPLES=OFF \
    -DSHARDTENSOR_BUILD_BENCHMARKS=OFF -DSHARDTENSOR_PYTHON=OFF
if grep -q 'CMake Error at cmake/SharedLibstdcxx.cmake' "$out/compiler_check.txt"; then
  export CXX=$(command -v g++) CC=$(command -v gcc)
  echo "gpu_check/run.sh: the configure check refused \$CXX; building with $CXX ($($CXX --version | head -1))" | tee -a "$out/environment.txt"
fi
rm -rf build-gpu-compiler-check
# The device tool brings back at most 8 files: logs that served their purpose fold into others.
{ echo "== compiler_check (configure without tests)"; cat "$out/compiler_check.txt"; } >> "$out/environment.txt"; rm "$out/compiler_check.txt"
step googletest bash -c "cmake -S '$carry/googletest' -B '$carry/googletest-build' ${generator[*]} -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_POSITION_INDEPENDENT_CODE=ON -DCMAKE_INSTALL_PREFIX='$carry/gtest' && cmake --build '$carry/googletest-build' -j $jobs --target install" || exit 1
rm "$out/googletest.txt"
gtest_dir=$(dirname "$(find "$carry/gtest" -name GTestConfig.cmake | head -1)")
# NCCL's header and library: the wheel's nvidia-nccl package (its folder differs between CUDA
# lines: nvidia/nccl, nvidia/cu13), else the toolkit's. Named explicitly so that Torch.cmake's hints
# need not know every layout.
site=$(python3 -c 'import site; print(site.getsitepackages()[0])')
nccl_h=$(find "$site/nvidia" /usr/local/cuda/include /usr/include -name nccl.h 2>/dev/null | head -1)
nccl_so=$(find "$site/nvidia" /usr/local/cuda/lib64 /usr/lib/x86_64-linux-gnu -name 'libnccl.so*' 2>/dev/null | head -1)
echo "nccl.h: ${nccl_h:-not found}; libnccl: ${nccl_so:-not found}" | tee -a "$out/environment.txt"
nccl_args=()
[ -n "$nccl_h" ] && [ -n "$nccl_so" ] && nccl_args=(-DNCCL_INCLUDE_DIR="$(dirname "$nccl_h")" -DNCCL_LIBRARY="$nccl_so")
# The Python extension too, where this python3 has its headers (python/CMakeLists.txt).
python_args=(-DSHARDTENSOR_PYTHON=OFF)
python3 -c 'import sysconfig, os, sys; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' &&
  python_args=(-DSHARDTENSOR_PYTHON=ON -DPython_EXECUTABLE="$(command -v python3)")
step configure cmake -S . -B build-gpu "${generator[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTorch_DIR="$torch_dir" \
    -DGLOO_INCLUDE_DIR="$carry/include" -DXXHASH_INCLUDE_DIR="$carry/include" -DGTest_DIR="$gtest_dir" -DSHARDTENSOR_BUILD_EXAMPLES=OFF \
    "${nccl_args[@]}" "${python_args[@]}" || exit 1
grep -q 'SHARDTENSOR_HAVE_NCCL=ON' "$out/configure.txt" || echo "gpu_check/run.sh: the configure log does not say NCCL is on (see configure.txt)"
[ "${1:-}" = --configure-only ] && exit 0
targets=(cuda_tests shardrun)
[ "${python_args[0]}" = -DSHARDTENSOR_PYTHON=ON ] && targets+=(shardtensor_python)
keep_going=(-k 0); [ ${#generator[@]} -eq 0 ] && keep_going=(-k)  # every compile error in one run, not the first
step build cmake --build build-gpu -j "$jobs" --target "${targets[@]}" -- "${keep_going[@]}" || exit 1
# Whether libshardtensor imports libstdc++ (as it must) or carries a copy of it.
echo "libshardtensor.so defines std::ostream::_M_insert<long> (a copy of libstdc++): $(nm -D --defined-only build-gpu/src/libshardtensor.so | grep -c _ZNSo9_M_insertIlEERSoT_) time(s)" | tee -a "$out/environment.txt"
step cuda_tests env SHARDTENSOR_TIMEOUT_S=60 build-gpu/tools/shardrun/shardrun -n 1 --timeout 300 build-gpu/tests/cuda_tests
status=$?
# The Python package from the build tree (no pip: _C finds libshardtensor through its build RPATH):
# the CUDA tests of tests/python at the world sizes this machine's GPUs allow.
if [ "${python_args[0]}" = -DSHARDTENSOR_PYTHON=ON ]; then
  rm -rf build-gpu/pkg && mkdir -p build-gpu/pkg && cp -r python/shardtensor build-gpu/pkg/ &&
    cp build-gpu/python/_C*.so build-gpu/pkg/shardtensor/
  step python_cuda env PYTHONPATH="$PWD/build-gpu/pkg" python3 -m pytest -q -rs -p no:cacheprovider tests/python/test_cuda.py || {
    status=1
    # Which step failed, and where in native code: one rank, step by step, under faulthandler
    # (the Python stack) with fault_stack.c preloaded (the native stack; the image has no gdb).
    # faulthandler prints first, then hands the signal back to fault_stack.
    smoke_env=(env RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29561
               SHARDTENSOR_TIMEOUT_S=30 PYTHONPATH="$PWD/build-gpu/pkg" PYTHONUNBUFFERED=1)
    preload=()
    cc -shared -fPIC -O1 -o build-gpu/fault_stack.so tools/gpu_check/fault_stack.c && preload=(LD_PRELOAD="$PWD/build-gpu/fault_stack.so")
    step python_smoke "${smoke_env[@]}" "${preload[@]}" timeout 120 python3 -X faulthandler tools/gpu_check/python_smoke.py
    resolve_frames "$out/python_smoke.txt" > "$out/python_smoke_stack.txt"
    echo "== native stack (python_smoke_stack.txt)"; head -60 "$out/python_smoke_stack.txt"
  }
  # Python benchmarks, timing only (they do not change the status), into one file (the device
  # tool brings back a limited number of files):
  # - per-op overhead from Python (section 1 of bench/python_bench.py: plain torch, shardtensor
  #   and torch's DTensor), on this machine's CPU at 2 ranks, then on CUDA pieces at one rank (a
  #   cuda mesh over NCCL wants one GPU per rank): the host cost of each op's launch;
  # - torch.compile against eager on CUDA at one rank (bench/compile_bench.py --device cuda:
  #   the TP-MLP against DTensor, and the U-Net; Inductor's Triton kernels), with shardtensor's
  #   operators traced (the default) and behind graph breaks (SHARDTENSOR_COMPILE=eager).
  step python_bench env PYTHONPATH="$PWD/build-gpu/pkg" OMP_NUM_THREADS=1 bash -c '
    shardrun=build-gpu/tools/shardrun/shardrun
    bench=(bench/python_bench.py --sections 1 --cxx none --cxx-dispatch none)
    timeout 150 $shardrun -n 2 python3 "${bench[@]}"
    timeout 150 $shardrun -n 1 python3 "${bench[@]}" --device cuda
    for mode in trace eager; do
      echo "== compile_bench --device cuda, SHARDTENSOR_COMPILE=$mode"
      SHARDTENSOR_COMPILE=$mode timeout 200 $shardrun -n 1 --timeout 200 python3 bench/compile_bench.py --device cuda --steps 20
    done'
else
  echo "gpu_check/run.sh: python3 has no Python.h here; the Python CUDA tests did not run" | tee -a "$out/environment.txt"
fi
exit $status
