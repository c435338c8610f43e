#!/usr/bin/env bash
# Does a shared library built here link libstdc++ dynamically? A copy of libstdc++ linked into
# libshardtensor.so breaks as soon as a process (Python with torch) has already loaded
# libstdc++.so.6: global symbols bind to one copy and the library's internal calls to the
# other, so an ostream's locale facets are not found (a SIGSEGV in operator<<). Prints what
# the toolchain links and what a one-line shared library ends up defining.
set -u
echo "CC=${CC:-} CXX=${CXX:-} CXXFLAGS=${CXXFLAGS:-} LDFLAGS=${LDFLAGS:-} LIBRARY_PATH=${LIBRARY_PATH:-}"
for name in libstdc++.so libstdc++.a libstdc++_nonshared.a; do
  path=$(g++ -print-file-name=$name); echo "g++ -print-file-name=$name: $path"; [ -e "$path" ] && ls -laL "$path"
done
ls -la /usr/lib/gcc/x86_64-linux-gnu/*/libstdc++* 2>&1 | head
work=$(mktemp -d)
printf '#include <sstream>\nstd::string f(long v) { std::ostringstream s; s << v; return s.str(); }\n' > "$work/t.cpp"
g++ -shared -fPIC -O2 -o "$work/t.so" "$work/t.cpp" -Wl,--trace 2>&1 | grep -i stdc
echo "defined std symbols in a one-line library: $(nm -D --defined-only "$work/t.so" | grep -c 'St\|NSo')"
ldd "$work/t.so" | grep -i stdc
# What torch's own libraries define of libstdc++ (a wheel built with a static libstdc++ part
# exports some of it), and the link line CMake gives libshardtensor here.
site=$(python3 -c 'import torch, os; print(os.path.dirname(torch.__file__))')
for lib in libtorch_cpu.so libc10.so libtorch_python.so; do
  echo "$lib defines $(nm -D --defined-only "$site/lib/$lib" | grep -c '_ZNSo9_M_insert\|_ZNSt6locale') ostream/locale symbols"
done
cmake -S . -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTorch_DIR="$(python3 -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')/Torch" \
  -DSHARDTENSOR_BUILD_TESTS=OFF -DSHARDTENSOR_BUILD_EXAMPLES=OFF -DSHARDTENSOR_BUILD_BENCHMARKS=OFF -DGLOO_INCLUDE_DIR="$PWD/.gpu-carry/include" > "$work/configure.txt" 2>&1 || tail -20 "$work/configure.txt"
ninja -C "$work/build" -t commands shardtensor | grep -- ' -shared ' | tail -1 | tr ' ' '\n' | grep -v '\.o$' | tr '\n' ' '; echo
