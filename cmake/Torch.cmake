# Finds libtorch and exposes it as one interface target, shardtensor_torch_deps.
#
# Debian's libtorch-dev installs TorchConfig.cmake under the multiarch cmake dir, so a plain
# find_package(Torch) works; a pytorch.org libtorch 2.x tree is used when Torch_DIR points at it.
# Everything version-specific in C++ lives in src/util/torch_compat.h, not here.
find_package(Torch REQUIRED)
message(STATUS "shardtensor: libtorch ${Torch_VERSION} from ${Torch_DIR}")

# c10d guards its Gloo process group behind USE_C10D_GLOO; the Gloo headers come from libgloo-dev
# on Debian and ship inside the libtorch tree elsewhere.
find_path(GLOO_INCLUDE_DIR gloo/config.h HINTS ${TORCH_INCLUDE_DIRS})
if(NOT GLOO_INCLUDE_DIR)
  message(FATAL_ERROR "Gloo headers not found (gloo/config.h). On Debian: apt-get install libgloo-dev")
endif()

add_library(shardtensor_torch_deps INTERFACE)
target_link_libraries(shardtensor_torch_deps INTERFACE ${TORCH_LIBRARIES})
target_include_directories(shardtensor_torch_deps INTERFACE
  $<BUILD_INTERFACE:${TORCH_INCLUDE_DIRS}> $<BUILD_INTERFACE:${GLOO_INCLUDE_DIR}>)
target_compile_definitions(shardtensor_torch_deps INTERFACE USE_C10D_GLOO)
# TORCH_CXX_FLAGS carries the _GLIBCXX_USE_CXX11_ABI setting that libtorch was built with.
separate_arguments(_torch_cxx_flags UNIX_COMMAND "${TORCH_CXX_FLAGS}")
target_compile_options(shardtensor_torch_deps INTERFACE ${_torch_cxx_flags})

# NCCL process groups exist only in CUDA builds of libtorch.
if(TARGET torch_cuda OR TORCH_CUDA_LIBRARIES)
  find_file(_nccl_pg_header torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp HINTS ${TORCH_INCLUDE_DIRS})
  if(_nccl_pg_header)
    set(SHARDTENSOR_HAVE_NCCL ON)
  endif()
endif()
