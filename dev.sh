#!/usr/bin/env bash
# The project's entry point (the README's two commands use it):
#   ./dev.sh demo [RANKS] [OPTIONS]  build, then run the main demo (a U-Net on a spatially
#                           sharded heat field) on RANKS local ranks (default 4); OPTIONS go to
#                           the demo: --mesh 2x2, --steps N, --out DIR
#   ./dev.sh test           build, then run every test (unit, 1-4 ranks, launcher)
#   ./dev.sh build          configure and build only
# Each first installs the Debian packages it needs that are missing (apt-get; root or sudo).
# BUILD_DIR (default build) and CMAKE_ARGS (e.g. -DTorch_DIR=/opt/libtorch/share/cmake/Torch)
# change where and how it builds.
set -euo pipefail
cd "$(dirname "$0")"
BUILD_DIR=${BUILD_DIR:-build}
PACKAGES=(cmake make g++ ccache libtorch-dev libgloo-dev libgtest-dev libbenchmark-dev libopenblas0)

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

build() {
  install_missing_packages
  if [ ! -f "$BUILD_DIR/CMakeCache.txt" ]; then
    # shellcheck disable=SC2086
    cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo ${CMAKE_ARGS:-}
  fi
  cmake --build "$BUILD_DIR" -j2
}

case "${1:-}" in
  demo)
    build
    ranks=${2:-4}
    shift $(( $# > 1 ? 2 : 1 ))
    exec "$BUILD_DIR/tools/shardrun/shardrun" -n "$ranks" --timeout 1200 "$BUILD_DIR/examples/heat_unet_demo" "$@"
    ;;
  test)
    build
    exec ctest --test-dir "$BUILD_DIR" --output-on-failure --timeout 900
    ;;
  build)
    build
    ;;
  *)
    echo "usage: ./dev.sh demo [RANKS] [--mesh AxB] [--steps N] [--out DIR] | test | build" >&2
    exit 2
    ;;
esac
