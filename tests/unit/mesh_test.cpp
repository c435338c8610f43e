// DeviceMesh topology without communicators: coordinates, slices, names, validation.
#include <gtest/gtest.h>

#include "mesh/mesh_impl.h"
#include "shardtensor/device_mesh.h"
#include "shardtensor/spec.h"
#include "support/reference.h"

using namespace shardtensor;

TEST(DeviceMeshTopology, RowMajorCoordinates) {
  DeviceMesh mesh = DeviceMesh::without_comms({2, 3}, /*my_rank=*/4);
  EXPECT_EQ(mesh.ndim(), 2);
  EXPECT_EQ(mesh.size(), 6);
  EXPECT_EQ(mesh.size(1), 3);
  EXPECT_EQ(mesh.coordinate(), (std::vector<int64_t>{1, 1}));
  EXPECT_EQ(mesh.coordinate_of(5), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(mesh.rank_at({0, 2}), 2);
  EXPECT_EQ(mesh.to_string(), "mesh(2x3)");
}

TEST(DeviceMeshTopology, SubmeshIsTheSliceThroughThisRank) {
  DeviceMesh mesh = DeviceMesh::without_comms({2, 3}, /*my_rank=*/4, {"dp", "tp"});
  DeviceMesh tp = mesh.submesh("tp");
  EXPECT_EQ(tp.ranks(), (std::vector<int64_t>{3, 4, 5}));
  EXPECT_EQ(tp.coordinate(), (std::vector<int64_t>{1}));
  DeviceMesh dp = mesh.submesh(0);
  EXPECT_EQ(dp.ranks(), (std::vector<int64_t>{1, 4}));
  EXPECT_EQ(dp.dim_names(), (std::vector<std::string>{"dp"}));
  EXPECT_EQ(mesh.to_string(), "mesh(dp=2 x tp=3)");
}

TEST(DeviceMeshTopology, ThreeDimensionalMesh) {
  DeviceMesh mesh = DeviceMesh::without_comms({2, 1, 2}, /*my_rank=*/3);
  EXPECT_EQ(mesh.coordinate(), (std::vector<int64_t>{1, 0, 1}));
  EXPECT_EQ(mesh.submesh(2).ranks(), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(mesh.submesh(1).ranks(), (std::vector<int64_t>{3}));
}

TEST(DeviceMeshTopology, EqualityIsShapeAndLayout) {
  EXPECT_EQ(DeviceMesh::without_comms({2, 2}, 0), DeviceMesh::without_comms({2, 2}, 3));
  EXPECT_NE(DeviceMesh::without_comms({2, 2}, 0), DeviceMesh::without_comms({4}, 0));
  EXPECT_NE(DeviceMesh::without_comms({1, 4}, 0), DeviceMesh::without_comms({4, 1}, 0));
}

TEST(DeviceMeshTopology, AMeshOverSomeRanksLeavesTheOthersOutside) {
  const auto inside = make_mesh_topology({2}, {3, 1}, {}, 1, 4);
  EXPECT_TRUE(DeviceMesh(inside).includes_this_rank());
  EXPECT_EQ(inside->coordinate, (std::vector<int64_t>{1}));
  const DeviceMesh outside(make_mesh_topology({2}, {3, 1}, {}, 0, 4));
  EXPECT_FALSE(outside.includes_this_rank());
  EXPECT_ERROR_CONTAINS(outside.coordinate(), "global rank 0 is not one of the ranks [3, 1]", "has no coordinate");
  EXPECT_ERROR_CONTAINS(outside.submesh(0), "has no slice");
  // A spec on it gives this rank the empty piece.
  const ShardTensorSpec spec(outside, {Shard(0)}, {5, 2}, at::kFloat);
  EXPECT_EQ(spec.local_shape(), (std::vector<int64_t>{0, 0}));
  EXPECT_EQ(spec.local_shape({1}), (std::vector<int64_t>{2, 2}));
}

TEST(DeviceMeshTopology, RejectsBadLayouts) {
  EXPECT_ERROR_CONTAINS(make_mesh_topology({3}, {0, 1, 2, 3}, {}, 0, 4), "4 ranks were listed for mesh shape 3",
                        "which needs 3");
  EXPECT_ERROR_CONTAINS(make_mesh_topology({2, 2}, {0, 1, 1, 3}, {}, 0, 4), "lists rank 1 more than once");
  EXPECT_ERROR_CONTAINS(make_mesh_topology({2}, {0, 4}, {}, 0, 4), "names rank 4", "world of 4 ranks");
  EXPECT_ERROR_CONTAINS(make_mesh_topology({2, 0}, {}, {}, 0, 4), "has a dim of size 0");
  EXPECT_ERROR_CONTAINS(make_mesh_topology({}, {}, {}, 0, 1), "mesh shape is empty");
  EXPECT_ERROR_CONTAINS(make_mesh_topology({2}, {0, 1}, {"x", "y"}, 0, 2), "2 dim names [x, y]", "1-d mesh");
  EXPECT_ERROR_CONTAINS(make_mesh_topology({1, 2}, {0, 1}, {"x", "x"}, 0, 2), "'x' is used twice");
  DeviceMesh mesh = DeviceMesh::without_comms({2, 2}, 0);
  EXPECT_ERROR_CONTAINS(mesh.size(2), "mesh dim 2 is out of range", "[0, 2)");
  EXPECT_ERROR_CONTAINS(mesh.mesh_dim("tp"), "no mesh dim is named 'tp'");
  EXPECT_ERROR_CONTAINS(mesh.comm(0), "without communicators");
}
