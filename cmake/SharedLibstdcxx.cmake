# libshardtensor and the Python extension must use the shared libstdc++.so.6 that libtorch uses.
# A compiler whose C++ runtime is linked statically into shared libraries (a toolchain built
# without a shared libstdc++, or one whose specs add -static-libstdc++) puts a second copy of
# libstdc++ into libshardtensor.so. In a process that loaded libstdc++.so.6 first (Python with
# torch), the library's exported libstdc++ symbols bind to that copy and its internal calls to
# its own, so the two disagree on locale facet ids and the first `ostream << long` crashes
# (SIGSEGV). Seen on a GPU image whose $CXX was such a toolchain. This configure-time check
# builds a one-line shared library with the project's compiler and flags and refuses to go on
# if that library defines libstdc++'s own ostream code instead of importing it.
function(shardtensor_require_shared_libstdcxx)
  if(NOT CMAKE_SYSTEM_NAME STREQUAL "Linux" OR NOT CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang" OR NOT CMAKE_NM)
    return()
  endif()
  set(signature "${CMAKE_CXX_COMPILER}|${CMAKE_CXX_FLAGS}|${CMAKE_SHARED_LINKER_FLAGS}")
  if(SHARDTENSOR_SHARED_LIBSTDCXX_CHECKED STREQUAL signature)
    return()  # checked for this compiler and these flags in an earlier configure
  endif()
  set(dir "${CMAKE_BINARY_DIR}/CMakeFiles/shared_libstdcxx_check")
  file(WRITE "${dir}/probe.cpp"
       "#include <sstream>\nstd::string shardtensor_probe(long v) { std::ostringstream s; s << v; return s.str(); }\n")
  separate_arguments(compile_flags UNIX_COMMAND "${CMAKE_CXX_FLAGS}")
  separate_arguments(link_flags UNIX_COMMAND "${CMAKE_SHARED_LINKER_FLAGS}")
  execute_process(COMMAND "${CMAKE_CXX_COMPILER}" ${compile_flags} -fPIC -shared ${link_flags} -o "${dir}/probe.so" "${dir}/probe.cpp"
                  RESULT_VARIABLE built ERROR_VARIABLE build_error OUTPUT_QUIET)
  if(NOT built EQUAL 0)
    message(WARNING "shardtensor: could not build a one-line shared library to check how ${CMAKE_CXX_COMPILER} links "
                    "libstdc++ (${build_error}); not checked.")
    return()
  endif()
  execute_process(COMMAND "${CMAKE_NM}" -D --defined-only "${dir}/probe.so" OUTPUT_VARIABLE defined ERROR_QUIET)
  if(defined MATCHES "_ZNSo9_M_insertIlEERSoT_")
    message(FATAL_ERROR
      "shardtensor: the C++ compiler ${CMAKE_CXX_COMPILER} (${CMAKE_CXX_COMPILER_ID} ${CMAKE_CXX_COMPILER_VERSION}) "
      "links libstdc++ statically into shared libraries: a one-line shared library built with it defines "
      "std::ostream::_M_insert<long> instead of importing it from libstdc++.so.6. libtorch uses the shared "
      "libstdc++.so.6, and two copies of libstdc++ in one process crash (SIGSEGV in ostream output, as soon as "
      "Python with torch loads libshardtensor). Configure with a compiler that links the shared libstdc++, e.g. "
      "-DCMAKE_CXX_COMPILER=/usr/bin/g++ (or CXX=/usr/bin/g++ for pip), in a fresh build directory.")
  endif()
  set(SHARDTENSOR_SHARED_LIBSTDCXX_CHECKED "${signature}" CACHE INTERNAL "compiler and flags whose libstdc++ linkage was checked")
endfunction()

shardtensor_require_shared_libstdcxx()
