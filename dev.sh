#!/usr/bin/env bash
# The project's entry point (the README's two commands use it):
#   ./dev.sh demo [RANKS] [OPTIONS]  build, then run the main demo (a U-Net on a spatially
#                           sharded heat field) on RANKS local ranks (default 4); OPTIONS go to
#                           the demo: --mesh 2x2, --steps N, --out DIR, --device cuda
#   ./dev.sh test           build and run every test (unit, 1-4 ranks, failure, launcher,
#                           package, demo) on each torch line in turn, then the Python
#                           package's pytest suite on the wheel line
#   ./dev.sh build          configure and build only
#   ./dev.sh pydemo [RANKS] [OPTIONS]  the Python package's demo (examples/heat_unet_demo.py)
#                           on RANKS local ranks, on torch==2.15.0 in .venv
#   ./dev.sh python         build and install the Python package (pip install .) into .venv
#
# Torch lines (TORCH_LINE, default "all" for test and "debian" for demo and build):
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
PACKAGES=(cmake make g++ ccache libtorch-dev libgloo-dev libgtest-dev libbenchmark-dev libopenblas0 python3-venv python3-dev libpng-dev)

install_missing_packages() {
  local missing=()
  for p in "${PACKAGES[@]}"; do
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
PYTHON_TOOLS=(numpy pytest scikit-build-core matplotlib)

install_python_tools() {
  install_torch_wheel || return 1
  "$VENV/bin/python" -c "import numpy, pytest, scikit_build_core, matplotlib" 2>/dev/null && return 0
  echo "dev.sh: installing ${PYTHON_TOOLS[*]} into $VENV"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check "${PYTHON_TOOLS[@]}"
}

# The Python package (pip install of this checkout), built against .venv's torch in
# build-python/ (pyproject.toml), so a rebuild only compiles what changed.
install_python_package() {
  install_python_tools || return 1
  echo "dev.sh: building and installing the Python package shardtensor into $VENV"
  # The generator, compiler and parallelism of build_line, so that each library compile has the
  # command line it had in build-torch2/ and ccache serves it: a Ninja tree runs its compiles from
  # another directory, and scikit-build-core would otherwise take Python's CXX (g++, not c++),
  # and either changes ccache's key. A tree configured otherwise is started again.
  local cxx=${CXX:-c++}
  if grep -qs '^CMAKE_GENERATOR:INTERNAL=Ninja' build-python/CMakeCache.txt ||
     { [ -f build-python/CMakeCache.txt ] && ! grep -qs "^CMAKE_CXX_COMPILER:FILEPATH=$(command -v "$cxx")\$" build-python/CMakeCache.txt; }; then
    rm -rf build-python
  fi
  CXX=$cxx CMAKE_GENERATOR="Unix Makefiles" CMAKE_BUILD_PARALLEL_LEVEL=2 "$VENV/bin/pip" install --quiet --disable-pip-version-check --no-build-isolation --no-deps .
}

test_python() {
  install_python_package || { echo "dev.sh: building the Python package failed" >&2; return 1; }
  echo "== Python package on torch $TORCH_WHEEL_VERSION: pytest tests/python (world sizes 1-4) =="
  "$VENV/bin/python" -m pytest -q -rs tests/python   # -rs: every skip prints its reason
}

# Sets build_dir and cmake_args for line $1.
select_line() {
  case "$1" in
    debian)
      build_dir=${BUILD_DIR:-build}
      cmake_args=${CMAKE_ARGS:-}
      ;;
    wheel)
      install_torch_wheel || return 1
      build_dir=build-torch2
      cmake_args="-DTorch_DIR=$("$VENV/bin/python" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)' 2>/dev/null)/Torch"
      ;;
    *)
      echo "dev.sh: TORCH_LINE=$1 is not a torch line; use debian, wheel or all." >&2
      exit 2
      ;;
  esac
}

build_line() {
  select_line "$1" || return 1
  if [ ! -f "$build_dir/CMakeCache.txt" ]; then
    # shellcheck disable=SC2086
    cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo $cmake_args || return 1
  fi
  cmake --build "$build_dir" -j2 || return 1
}

# Callers use `test_line ... || status=1`, where bash ignores `set -e` inside the function:
# every step that can fail returns explicitly, so a failed build never tests old binaries.
test_line() {
  build_line "$1" || { echo "dev.sh: the build of torch line '$1' failed" >&2; return 1; }
  echo "== torch line '$1': $(grep -m1 '^SHARDTENSOR_TORCH_LINE:' "$build_dir/CMakeCache.txt" | cut -d= -f2-) =="
  local status=0
  ctest --test-dir "$build_dir" --output-on-failure --timeout 900 || status=$?
  # Tests that could not run here (no GPU) say why; show it, so no skip goes unseen.
  grep -ho "cuda_tests: skipped: .*" "$build_dir/Testing/Temporary/LastTest.log" 2>/dev/null | sort -u || true
  return $status
}

lines_of() {
  if [ "$1" = all ]; then echo debian wheel; else echo "$1"; fi
}

install_missing_packages
case "${1:-}" in
  demo)
    line=${TORCH_LINE:-debian}
    build_line "$line"
    ranks=${2:-4}
    shift $(( $# > 1 ? 2 : 1 ))
    exec "$build_dir/tools/shardrun/shardrun" -n "$ranks" --timeout 1200 "$build_dir/examples/heat_unet_demo" "$@"
    ;;
  test)
    status=0
    for line in $(lines_of "${TORCH_LINE:-all}"); do
      start=$SECONDS
      test_line "$line" || status=1
      echo "== torch line '$line': built and tested in $(( SECONDS - start )) s =="
      if [ "$line" = wheel ]; then
        start=$SECONDS
        test_python || status=1
        echo "== Python package: built and tested in $(( SECONDS - start )) s =="
      fi
    done
    exit $status
    ;;
  pydemo)
    install_python_package
    ranks=${2:-4}
    shift $(( $# > 1 ? 2 : 1 ))
    exec "$VENV/bin/shardrun" -n "$ranks" --timeout 1200 "$VENV/bin/python" examples/heat_unet_demo.py "$@"
    ;;
  python)
    install_python_package
    ;;
  build)
    for line in $(lines_of "${TORCH_LINE:-debian}"); do build_line "$line"; done
    ;;
  *)
    echo "usage: [TORCH_LINE=debian|wheel|all] ./dev.sh demo [RANKS] [--mesh AxB] [--steps N] [--out DIR] | test | build" >&2
    echo "       ./dev.sh pydemo [RANKS] [--mesh AxB] [--steps N] [--out DIR] | python   (the Python package, torch $TORCH_WHEEL_VERSION)" >&2
    exit 2
    ;;
esac
