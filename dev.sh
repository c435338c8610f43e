#!/usr/bin/env bash
# The project's entry point (the README's two commands use it):
#   ./dev.sh demo [RANKS] [OPTIONS]  the main demo (examples/heat_unet_demo.py: a torch.nn U-Net
#                           on a spatially sharded heat field) on RANKS local ranks (default 4),
#                           on torch==2.15.0 in .venv; OPTIONS go to the demo: --mesh 2x2,
#                           --steps N, --out DIR
#   ./dev.sh test           CI's plan, each stage timed: the whole suite (unit, 1-4 ranks, faults,
#                           launcher, package, demos) on the wheel line, then the Python
#                           package's pytest suite (docs code blocks included)
#   TORCH_LINE=debian|wheel ./dev.sh test   the whole ctest suite on that line only
#   ./dev.sh build          configure and build only
#   ./dev.sh cdemo [RANKS] [OPTIONS]  the C++ demo (examples/heat_unet_demo.cpp), same options
#   ./dev.sh python         build and install the Python package (pip install .) into .venv
#   ./dev.sh bench [ARGS]   run the benchmarks and rewrite bench/RESULTS.md and bench/figures/
#   ./dev.sh flakes N [--load]  the multi-rank suites N times (beside a CPU load), then every
#                           test that failed at least once, with its failure (tools/flake_hunt.py)
#   ./dev.sh opinfo [--ops a,b] [--world-size N]  torch's OpInfo database on ShardTensors against
#                           one process (tests/python/opinfo_sweep.py), with a table of outcomes
#
# Torch lines (TORCH_LINE, default "debian" for cdemo and build):
#   debian  Debian 12's libtorch-dev 1.13.1, built in build/
#   wheel   torch==2.15.0 from PyPI (a CUDA build), installed into .venv/ in this checkout and
#           built in build-torch2/; its libtorch is what the C++ build uses, with NCCL on
#   all     both, one after the other (test only)
# Each line first installs what it needs that is missing: Debian packages through apt-get
# (root or sudo), the wheel through pip. The wheel and its CUDA libraries (about 3 GB) are
# downloaded once per machine into $SHARDTENSOR_WHEELHOUSE (default ~/.cache/shardtensor/wheels)
# and installed from there, so a fresh clone never downloads them again.
# BUILD_DIR and CMAKE_ARGS (e.g. -DTorch_DIR=/opt/libtorch/share/cmake/Torch) change where and
# how the debian line builds; they let any libtorch tree (a pytorch.org zip) stand in for it.
set -euo pipefail
cd "$(dirname "$0")"
TORCH_WHEEL_VERSION=2.15.0
WHEELHOUSE=${SHARDTENSOR_WHEELHOUSE:-${XDG_CACHE_HOME:-$HOME/.cache}/shardtensor/wheels}
VENV=.venv
# Release by default: debug information makes each torch-heavy compile about 1.6x slower and its
# object about 40x larger (kernels/pooling.cpp on torch 2.15: 16.4 s and 5.7 MB with -g, 10.0 s
# and 150 KB without), which CI's two cores pay on every line. BUILD_TYPE=RelWithDebInfo for gdb.
BUILD_TYPE=${BUILD_TYPE:-Release}
PACKAGES=(cmake make g++ ccache libgloo-dev libgtest-dev libbenchmark-dev libopenblas0 python3-venv python3-dev libpng-dev
          nlohmann-json3-dev libxxhash-dev)
# Only the Debian line needs Debian's libtorch (and the 190 packages it pulls in).
DEBIAN_LINE_PACKAGES=(libtorch-dev)

# $@: the packages to check (default: PACKAGES).
install_missing_packages() {
  local missing=() wanted=("$@")
  [ ${#wanted[@]} -gt 0 ] || wanted=("${PACKAGES[@]}")
  for p in "${wanted[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  echo "dev.sh: installing missing Debian packages: ${missing[*]}"
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo=sudo
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}"
}

free_gib() { df -Pk "$1" | awk 'NR == 2 { print int($4 / 1048576) }'; }

# Fails early and says why when a disk cannot hold what comes next, instead of half-way
# through an unpack. $1: folder, $2: GiB needed, $3: what for.
require_disk() {
  mkdir -p "$1"
  local have
  have=$(free_gib "$1")
  if [ "$have" -lt "$2" ]; then
    echo "dev.sh: $3 needs about $2 GiB free under $1, but only $have GiB is free." >&2
    echo "dev.sh: free some space there, or point SHARDTENSOR_WHEELHOUSE at a larger disk." >&2
    exit 3
  fi
}

venv_has_torch() {
  [ -x "$VENV/bin/python" ] &&
    "$VENV/bin/python" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$TORCH_WHEEL_VERSION')" 2>/dev/null
}

# torch==$TORCH_WHEEL_VERSION in .venv: downloaded into the wheelhouse only when it is not
# there yet, then installed from it without asking the index again.
install_torch_wheel() {
  venv_has_torch && return 0
  if ! ls "$WHEELHOUSE"/torch-"$TORCH_WHEEL_VERSION"*.whl > /dev/null 2>&1; then
    require_disk "$WHEELHOUSE" 6 "downloading torch==$TORCH_WHEEL_VERSION and its CUDA libraries (about 3 GB)"
    echo "dev.sh: downloading torch==$TORCH_WHEEL_VERSION into $WHEELHOUSE (once per machine)"
    python3 -m pip download --quiet --only-binary=:all: --dest "$WHEELHOUSE" "torch==$TORCH_WHEEL_VERSION" || return 1
  fi
  require_disk . 8 "installing torch==$TORCH_WHEEL_VERSION into $VENV (about 6 GB unpacked)"
  [ -x "$VENV/bin/python" ] || python3 -m venv "$VENV" || return 1
  echo "dev.sh: installing torch==$TORCH_WHEEL_VERSION into $VENV from $WHEELHOUSE"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check --no-index --find-links "$WHEELHOUSE" \
    "torch==$TORCH_WHEEL_VERSION"
}

# The Python package's build and test tools, in .venv beside torch (small: pip's cache serves
# them again on this machine).
PYTHON_TOOLS=(numpy pytest scikit-build-core matplotlib expecttest safetensors)

install_python_tools() {
  install_torch_wheel || return 1
  "$VENV/bin/python" -c "import numpy, pytest, scikit_build_core, matplotlib, expecttest, safetensors" 2>/dev/null && return 0
  echo "dev.sh: installing ${PYTHON_TOOLS[*]} into $VENV"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check "${PYTHON_TOOLS[@]}"
}

# The Python package (pip install of this checkout), built in the wheel line's own tree,
# build-torch2/, so that the library is compiled once for both: a second tree could not take the
# objects from ccache, since every compile hashes the precompiled header and GCC never writes
# two alike (measured: 1 hit in 210, and 9.8 min for the package alone). The tree keeps its
# tests, examples and benchmarks configured, so `./dev.sh test` finds it as build_line left
# it; pip builds only the extension and the launcher it installs.
install_python_package() {
  install_python_tools || return 1
  select_line wheel || return 1
  echo "dev.sh: building (in $build_dir/) and installing the Python package shardtensor into $VENV"
  local defines=() option
  for option in "${WHEEL_TREE_OPTIONS[@]}"; do defines+=("--config-settings=cmake.define.$option"); done
  CXX=${CXX:-c++} CMAKE_GENERATOR="Unix Makefiles" CMAKE_BUILD_PARALLEL_LEVEL=2 \
    "$VENV/bin/pip" install --quiet --disable-pip-version-check --no-build-isolation --no-deps \
    --config-settings=build-dir="$build_dir" --config-settings=cmake.build-type="$BUILD_TYPE" \
    "${defines[@]}" --config-settings=build.targets="shardtensor_python;shardrun" .
}

# The installed package's pytest suite, tests/python/test_docs.py (every code block of README.md
# and docs/) included.
run_pytest() {
  echo "== Python package on torch $TORCH_WHEEL_VERSION: pytest tests/python (world sizes 1-4) =="
  # -rs: every skip prints its reason; --durations: where the suite's time goes (CI has 90 minutes)
  "$VENV/bin/python" -m pytest -q -rs --durations=15 tests/python
}

test_python() {
  install_python_package || { echo "dev.sh: building the Python package failed" >&2; return 1; }
  run_pytest
}

# The wheel line's tree also builds the Python extension (install_python_package).
WHEEL_TREE_OPTIONS=(SHARDTENSOR_PYTHON=ON SHARDTENSOR_BUILD_TESTS=ON SHARDTENSOR_BUILD_EXAMPLES=ON SHARDTENSOR_BUILD_BENCHMARKS=ON)

# Sets build_dir and cmake_args for line $1.
select_line() {
  case "$1" in
    debian)
      install_missing_packages "${DEBIAN_LINE_PACKAGES[@]}" || return 1
      build_dir=${BUILD_DIR:-build}
      cmake_args=${CMAKE_ARGS:-}
      ;;
    wheel)
      install_torch_wheel || return 1
      build_dir=build-torch2
      cmake_args="${WHEEL_TREE_OPTIONS[*]/#/-D} -DPython_EXECUTABLE=$PWD/$VENV/bin/python -DTorch_DIR=$("$VENV/bin/python" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)' 2>/dev/null)/Torch"
      ;;
    *)
      echo "dev.sh: TORCH_LINE=$1 is not a torch line; use debian or wheel." >&2
      exit 2
      ;;
  esac
}

# $1: line; further arguments: the targets to build (default: all).
build_line() {
  select_line "$1" || return 1
  shift
  if ! grep -qs "^CMAKE_BUILD_TYPE:STRING=$BUILD_TYPE\$" "$build_dir/CMakeCache.txt"; then
    # shellcheck disable=SC2086
    cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE="$BUILD_TYPE" $cmake_args || return 1
  fi
  local targets=()
  [ $# -gt 0 ] && targets=(--target "$@")
  cmake --build "$build_dir" -j2 "${targets[@]}" || return 1
}

CTEST_JOBS=${CTEST_JOBS:-4}

# Runs ctest in the tree of line $1 (extra arguments go to ctest, e.g. -L smoke). Callers use
# `... || status=1`, where bash ignores `set -e` inside the function: every step that can fail
# returns explicitly, so a failed build never tests old binaries.
ctest_line() {
  select_line "$1" || return 1
  echo "== torch line '$1': $(grep -m1 '^SHARDTENSOR_TORCH_LINE:' "$build_dir/CMakeCache.txt" | cut -d= -f2-) =="
  shift
  local status=0
  # -j: the tests that mostly wait run beside the ones that compute (tests/CMakeLists.txt: the
  # "cores" lock keeps two of those from running at once).
  ctest --test-dir "$build_dir" --output-on-failure --timeout 900 -j "$CTEST_JOBS" "$@" || status=$?
  # Tests that could not run here (no GPU) say why; show it, so no skip goes unseen.
  grep -ho "cuda_tests: skipped: .*" "$build_dir/Testing/Temporary/LastTest.log" 2>/dev/null | sort -u || true
  return $status
}

# Stages of `./dev.sh test` (and the apt step of every command): each is timed, and `test`
# prints the table at the end, failed or not.
stage_names=()
stage_seconds=()
stage_results=()
stage() {
  local name=$1 start=$SECONDS result=passed
  shift
  echo "== stage '$name' =="
  "$@" || result=FAILED
  stage_names+=("$name")
  stage_seconds+=($(( SECONDS - start )))
  stage_results+=("$result")
  [ "$result" = passed ]
}

print_stages() {
  local i total=0
  echo "== stages (seconds) =="
  for i in "${!stage_names[@]}"; do
    printf '%-44s %6d s  %s\n' "${stage_names[$i]}" "${stage_seconds[$i]}" "${stage_results[$i]}"
    total=$(( total + stage_seconds[i] ))
  done
  printf '%-44s %6d s  (%d min)\n' "total" "$total" $(( (total + 59) / 60 ))
}

# CI tests the torch that users run, 2.x from PyPI (docs/building.md: which torch versions are
# supported). The Debian line (libtorch 1.13) still builds and tests by hand:
# TORCH_LINE=debian ./dev.sh test.
ci_plan() {
  local status=0
  stage "wheel: install torch $TORCH_WHEEL_VERSION into $VENV" install_torch_wheel || return 1
  if stage "wheel: build" build_line wheel; then
    stage "wheel: ctest (the whole suite)" ctest_line wheel -LE subset || status=1
  else
    status=1
  fi
  if stage "python: pip install ." install_python_package; then
    stage "python: pytest (docs code blocks included)" run_pytest || status=1
  else
    status=1
  fi
  return $status
}

lines_of() {
  if [ "$1" = all ]; then echo debian wheel; else echo "$1"; fi
}

stage "apt: Debian packages" install_missing_packages
case "${1:-}" in
  demo)
    install_python_package
    ranks=${2:-4}
    shift $(( $# > 1 ? 2 : 1 ))
    exec "$VENV/bin/shardrun" -n "$ranks" --timeout 1200 "$VENV/bin/python" examples/heat_unet_demo.py "$@"
    ;;
  cdemo)
    line=${TORCH_LINE:-debian}
    build_line "$line"
    ranks=${2:-4}
    shift $(( $# > 1 ? 2 : 1 ))
    exec "$build_dir/tools/shardrun/shardrun" -n "$ranks" --timeout 1200 "$build_dir/examples/heat_unet_demo" "$@"
    ;;
  test)
    status=0
    case "${TORCH_LINE:-ci}" in
      ci)
        ci_plan || status=1
        ;;
      debian|wheel)
        line=$TORCH_LINE
        { stage "$line: build" build_line "$line" && stage "$line: ctest (the whole suite)" ctest_line "$line" -LE subset; } || status=1
        if [ "$line" = wheel ]; then stage "python: pip install . and pytest" test_python || status=1; fi
        ;;
      *)
        echo "dev.sh: TORCH_LINE=$TORCH_LINE is not a torch line; use debian or wheel (or leave it unset for CI's plan)." >&2
        exit 2
        ;;
    esac
    print_stages
    exit $status
    ;;
  pydemo)  # the old name of demo
    shift
    exec "$0" demo "$@"
    ;;
  python)
    install_python_package
    ;;
  flakes)  # ./dev.sh flakes N [--load] [tools/flake_hunt.py's options]
    shift
    build_line wheel
    install_python_package
    exec "$VENV/bin/python" tools/flake_hunt.py "$@"
    ;;
  opinfo)  # ./dev.sh opinfo [tests/python/opinfo_sweep.py's options]
    shift
    install_python_package
    exec "$VENV/bin/python" tests/python/opinfo_sweep.py "$@"
    ;;
  bench)
    shift
    build_line wheel
    install_python_package
    exec "$VENV/bin/python" bench/regenerate.py --build-dir build-torch2 "$@"
    ;;
  build)
    for line in $(lines_of "${TORCH_LINE:-debian}"); do build_line "$line"; done
    ;;
  *)
    echo "usage: ./dev.sh demo [RANKS] [--mesh AxB] [--steps N] [--out DIR]   (the Python demo, torch $TORCH_WHEEL_VERSION)" >&2
    echo "       ./dev.sh test | build | python | bench [ARGS] | flakes N [--load]" >&2
    echo "       [TORCH_LINE=debian|wheel] ./dev.sh cdemo [RANKS] [OPTIONS]   (the C++ demo)" >&2
    echo "       TORCH_LINE=debian|wheel ./dev.sh test   (the whole ctest suite on one line)" >&2
    exit 2
    ;;
esac
