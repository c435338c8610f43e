# shardtensor_find_torch(): find_package(Torch) from the tree Torch_DIR names, and only from it.
# Used by the build (cmake/Torch.cmake) and by the installed package (shardtensorConfig.cmake),
# so a program that links shardtensor links the libtorch shardtensor was built against.
#
# TorchConfig looks for its libraries and for Caffe2Config with PATHS, which CMake searches
# after the system's: with Debian's libtorch-dev installed, a Torch_DIR tree (the PyPI wheel, a
# pytorch.org zip) would get its own headers but Debian's libtorch.so and CPU-only Caffe2
# config. So the tree Torch_DIR names is put first, and the result is checked.
macro(shardtensor_find_torch)
  if(Torch_DIR)
    get_filename_component(_st_torch_prefix "${Torch_DIR}/../../.." ABSOLUTE)
    list(PREPEND CMAKE_PREFIX_PATH "${_st_torch_prefix}")
    if(NOT Caffe2_DIR AND EXISTS "${Torch_DIR}/../Caffe2/Caffe2Config.cmake")
      get_filename_component(Caffe2_DIR "${Torch_DIR}/../Caffe2" ABSOLUTE)
    endif()
  endif()
  find_package(Torch REQUIRED)
  get_filename_component(_st_torch_prefix "${Torch_DIR}/../../.." REALPATH)
  get_filename_component(_st_torch_library "${TORCH_LIBRARY}" REALPATH)
  string(FIND "${_st_torch_library}" "${_st_torch_prefix}/" _st_torch_library_at)
  if(NOT _st_torch_library_at EQUAL 0)
    message(FATAL_ERROR "shardtensor: Torch_DIR is ${Torch_DIR}, but libtorch was found at ${TORCH_LIBRARY}, "
                        "outside that tree. Remove the build directory's CMakeCache.txt and configure again.")
  endif()
endmacro()
