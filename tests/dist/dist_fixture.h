// Shared by the distributed tests: the meshes of this world size, created once and in the same
// order on every rank (mesh creation is collective).
#pragma once

#include <gtest/gtest.h>

#include <vector>

#include "shardtensor/shardtensor.h"
#include "support/reference.h"

namespace shardtensor::testing {

inline const std::vector<DeviceMesh>& test_meshes() {
  static const std::vector<DeviceMesh> meshes = [] {
    std::vector<DeviceMesh> out;
    for (const auto& shape : mesh_shapes_for(world_size())) out.push_back(DeviceMesh::create(shape));
    return out;
  }();
  return meshes;
}

}  // namespace shardtensor::testing
