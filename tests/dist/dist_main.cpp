// main() for the distributed test binaries: every rank runs the whole suite under shardrun.
// Rank 0 prints the full gtest report; the other ranks print only failures.
#include <gtest/gtest.h>

#include <iostream>

#include "shardtensor/device_mesh.h"

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (shardtensor::world_rank() != 0) ::testing::GTEST_FLAG(brief) = true;
  std::cout << "rank " << shardtensor::world_rank() << " of world size " << shardtensor::world_size() << std::endl;
  return RUN_ALL_TESTS();
}
