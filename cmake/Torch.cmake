# Finds libtorch and exposes it as one interface target, shardtensor_torch_deps.
#
# Two torch lines are built and tested (./dev.sh): Debian 12's libtorch-dev 1.13.1, found by a
# plain find_package(Torch), and the PyPI wheel's libtorch 2.x (torch.utils.cmake_prefix_path),
# reached through Torch_DIR, as is a pytorch.org libtorch zip. Every version difference in the
# build lives in this file; every one in C++ lives in src/util/torch_compat.h.
include(${CMAKE_CURRENT_LIST_DIR}/FindTorchTree.cmake)   # also installed: consumers find the same torch
shardtensor_find_torch()
get_filename_component(_torch_prefix "${Torch_DIR}/../../.." ABSOLUTE)

# c10d guards its Gloo process group behind USE_C10D_GLOO. Its headers need Gloo's: libgloo-dev
# on Debian. The wheel ships none, so the 2.x line uses Debian's too; c10d's Gloo classes hold
# Gloo objects only through pointers, so the header version does not change their layout.
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

# The wheel's CUDA libraries (NCCL, cudart, cuBLAS...) sit beside it in site-packages/nvidia and
# are newer than the toolkit's in /usr/local/cuda, which TorchConfig also links. Their folders go
# first in -rpath-link (ld resolves libtorch_cuda's own libnccl.so.2 through it) and in -rpath
# (so a program loads the libraries torch was built with, not the toolkit's older ones).
file(GLOB _wheel_cuda_lib_dirs LIST_DIRECTORIES true "${_torch_prefix}/../nvidia/*/lib")
if(_wheel_cuda_lib_dirs)
  list(PREPEND _wheel_cuda_lib_dirs "${_torch_prefix}/lib")
  string(REPLACE ";" ":" _wheel_cuda_path "${_wheel_cuda_lib_dirs}")
  target_link_options(shardtensor_torch_deps INTERFACE "LINKER:-rpath-link,${_wheel_cuda_path}"
                                                       "LINKER:-rpath,${_wheel_cuda_path}")
endif()

# NCCL process groups exist only in CUDA builds of libtorch (the wheel is one). c10d declares
# ProcessGroupNCCL under USE_C10D_NCCL and includes nccl.h: the wheel's own (nvidia-nccl) comes
# first, so the header matches the libnccl that libtorch_cuda loads; the CUDA toolkit's after.
set(SHARDTENSOR_HAVE_NCCL OFF)
if(TARGET torch_cuda OR TORCH_CUDA_LIBRARIES)
  set(SHARDTENSOR_TORCH_CUDA ON)
else()
  set(SHARDTENSOR_TORCH_CUDA OFF)
endif()
if(SHARDTENSOR_TORCH_CUDA)
  find_file(_nccl_pg_header torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp HINTS ${TORCH_INCLUDE_DIRS})
  find_path(NCCL_INCLUDE_DIR nccl.h
    HINTS "${_torch_prefix}/../nvidia/nccl/include" "$ENV{CUDA_HOME}/include" /usr/local/cuda/include)
  find_library(NCCL_LIBRARY NAMES libnccl.so.2 nccl NAMES_PER_DIR
    HINTS "${_torch_prefix}/../nvidia/nccl/lib" "$ENV{CUDA_HOME}/lib64" /usr/local/cuda/lib64)
  if(_nccl_pg_header AND NCCL_INCLUDE_DIR AND NCCL_LIBRARY)
    set(SHARDTENSOR_HAVE_NCCL ON)
    add_library(shardtensor_nccl INTERFACE)
    target_include_directories(shardtensor_nccl INTERFACE $<BUILD_INTERFACE:${NCCL_INCLUDE_DIR}>)
    target_link_libraries(shardtensor_nccl INTERFACE $<BUILD_INTERFACE:${NCCL_LIBRARY}>)
    target_compile_definitions(shardtensor_nccl INTERFACE USE_C10D_NCCL SHARDTENSOR_HAVE_NCCL)
  else()
    message(WARNING "shardtensor: libtorch is a CUDA build but ProcessGroupNCCL.hpp (${_nccl_pg_header}), nccl.h "
                    "(${NCCL_INCLUDE_DIR}) or libnccl (${NCCL_LIBRARY}) is missing: building without NCCL.")
  endif()
endif()

if(SHARDTENSOR_TORCH_CUDA)
  set(_line "libtorch ${Torch_VERSION}, CUDA build (toolkit ${CUDAToolkit_VERSION}), SHARDTENSOR_HAVE_NCCL=${SHARDTENSOR_HAVE_NCCL}")
else()
  set(_line "libtorch ${Torch_VERSION}, CPU only")
endif()
set(SHARDTENSOR_TORCH_LINE "${_line}" CACHE INTERNAL "the torch this tree is built against, printed by ./dev.sh test")
message(STATUS "shardtensor: ${SHARDTENSOR_TORCH_LINE}, from ${Torch_DIR}")
