// What this build of shardtensor was compiled with, pinned against what CMake found: a CUDA
// build of libtorch (the PyPI wheel) must give a shardtensor with the NCCL path compiled in.
#include <gtest/gtest.h>

#include <iostream>

#include "shardtensor/device_mesh.h"

TEST(Build, NcclIsCompiledInExactlyWhenLibtorchIsACudaBuild) {
  std::cout << "build: SHARDTENSOR_HAVE_NCCL=" << shardtensor::built_with_nccl()
            << " (libtorch CUDA build: " << SHARDTENSOR_EXPECT_NCCL << ")" << std::endl;
  EXPECT_EQ(shardtensor::built_with_nccl(), static_cast<bool>(SHARDTENSOR_EXPECT_NCCL));
}
