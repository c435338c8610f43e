// ShardTensorSpec: the default split follows torch.chunk, explicit and nested tables give the
// right shapes and offsets at every coordinate, and bad layouts raise clear errors.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "support/reference.h"

using namespace shardtensor;
using namespace shardtensor::testing;

TEST(ChunkSizes, MatchTorchChunkForManySizesAndShardCounts) {
  for (int64_t size = 0; size <= 24; ++size) {
    for (int64_t n = 1; n <= 7; ++n) {
      std::vector<int64_t> expected(n, 0);
      if (size > 0) {
        auto pieces = at::arange(size).chunk(n);
        for (size_t i = 0; i < pieces.size(); ++i) expected[i] = pieces[i].numel();
      }
      EXPECT_EQ(chunk_sizes(size, n), expected) << "size " << size << " over " << n;
    }
  }
  EXPECT_EQ(chunk_sizes(10, 4), (std::vector<int64_t>{3, 3, 3, 1}));
  EXPECT_EQ(chunk_sizes(2, 4), (std::vector<int64_t>{1, 1, 0, 0}));
}

TEST(ShardTensorSpec, DefaultUnevenRowsOnOneDimMesh) {
  ShardTensorSpec spec(DeviceMesh::without_comms({4}, 3), {Shard(0)}, {10, 6}, c10::kFloat);
  EXPECT_EQ(spec.sharding_of(0)->sizes, (std::vector<int64_t>{3, 3, 3, 1}));
  EXPECT_EQ(spec.sharding_of(0)->offsets, (std::vector<int64_t>{0, 3, 6, 9}));
  EXPECT_EQ(spec.local_shape(), (std::vector<int64_t>{1, 6}));
  EXPECT_EQ(spec.local_offsets(), (std::vector<int64_t>{9, 0}));
  EXPECT_FALSE(spec.is_even());
  EXPECT_EQ(spec.sharding_of(1), nullptr);
}

TEST(ShardTensorSpec, ExplicitSizesWinOverTheDefault) {
  ShardTensorSpec spec(DeviceMesh::without_comms({4}, 1), {Shard(0)}, {10, 6}, c10::kFloat, {{0, {1, 4, 2, 3}}});
  EXPECT_EQ(spec.local_shape(), (std::vector<int64_t>{4, 6}));
  EXPECT_EQ(spec.local_offsets(), (std::vector<int64_t>{1, 0}));
  EXPECT_EQ(spec.local_shape({3}), (std::vector<int64_t>{3, 6}));
  EXPECT_EQ(spec.local_offsets({3}), (std::vector<int64_t>{7, 0}));
  expect_spec_matches_reference(spec, {{0, {1, 4, 2, 3}}});
}

TEST(ShardTensorSpec, NestedShardingChunksTheOuterPieceAgain) {
  ShardTensorSpec spec(DeviceMesh::without_comms({2, 2}, 0), {Shard(0), Shard(0)}, {10, 6}, c10::kFloat);
  EXPECT_EQ(spec.sharding_of(0)->mesh_dims, (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(spec.sharding_of(0)->sizes, (std::vector<int64_t>{3, 2, 3, 2}));
  EXPECT_EQ(spec.sharding_of(0)->offsets, (std::vector<int64_t>{0, 3, 5, 8}));
  expect_spec_matches_reference(spec, {});
}

TEST(ShardTensorSpec, NestedExplicitInnerSizesMayDependOnTheOuterCoordinate) {
  // Outer pieces 5 and 5; inner split 1+4 under coordinate 0 and 2+3 under coordinate 1.
  ShardSizes sizes = {{0, {1, 4, 2, 3}}};
  ShardTensorSpec spec(DeviceMesh::without_comms({2, 2}, 2), {Shard(0), Shard(0)}, {10, 6}, c10::kFloat, sizes);
  EXPECT_EQ(spec.local_shape(), (std::vector<int64_t>{2, 6}));
  EXPECT_EQ(spec.local_offsets(), (std::vector<int64_t>{5, 0}));
  expect_spec_matches_reference(spec, sizes);
}

TEST(ShardTensorSpec, TwoDimsShardedOnATwoDimMeshWithDimsSmallerThanTheMesh) {
  for (std::vector<int64_t> shape : {std::vector<int64_t>{1, 1}, {3, 1}, {0, 5}, {5, 3}}) {
    for (Placements ps : {Placements{Shard(0), Shard(1)}, Placements{Shard(1), Shard(0)}, Placements{Shard(-1), Replicate()}}) {
      ShardTensorSpec spec(DeviceMesh::without_comms({2, 3}, 0), ps, shape, c10::kFloat);
      expect_spec_matches_reference(spec, {});
    }
  }
}

TEST(ShardTensorSpec, RandomLayoutsMatchTheReferenceAtEveryCoordinate) {
  const uint32_t seed = 20261121;
  std::mt19937 rng(seed);
  int cases = 0;
  for (const auto& mesh_shape : std::vector<std::vector<int64_t>>{{1}, {3}, {4}, {2, 2}, {1, 4}, {3, 2}, {2, 1, 2}, {2, 3, 2}}) {
    for (int i = 0; i < 60; ++i, ++cases) {
      const bool explicit_sizes = i % 2 == 1;
      RandomLayout layout = random_layout(rng, mesh_shape, explicit_sizes);
      SCOPED_TRACE("seed " + std::to_string(seed) + ", case " + std::to_string(cases) + ": " + layout.describe());
      ShardTensorSpec spec(DeviceMesh::without_comms(mesh_shape, 0), layout.placements, layout.shape, c10::kFloat, layout.sizes);
      expect_spec_matches_reference(spec, layout.sizes);
      // The explicit form rebuilds an equal spec.
      EXPECT_EQ(ShardTensorSpec(spec.mesh(), spec.placements(), spec.shape(), c10::kFloat, spec.shard_sizes()), spec);
    }
  }
}

TEST(ShardTensorSpec, EqualityAndHashSeeSizesPlacementsShapeAndDtype) {
  DeviceMesh mesh = DeviceMesh::without_comms({4}, 0);
  ShardTensorSpec a(mesh, {Shard(0)}, {10}, c10::kFloat);
  ShardTensorSpec b(mesh, {Shard(0)}, {10}, c10::kFloat, {{0, {3, 3, 3, 1}}});
  EXPECT_EQ(a, b);
  EXPECT_EQ(a.hash(), b.hash());
  EXPECT_NE(a, ShardTensorSpec(mesh, {Shard(0)}, {10}, c10::kFloat, {{0, {1, 4, 2, 3}}}));
  EXPECT_NE(a, ShardTensorSpec(mesh, {Replicate()}, {10}, c10::kFloat));
  EXPECT_NE(a, ShardTensorSpec(mesh, {Shard(0)}, {10}, c10::kDouble));
  EXPECT_NE(a, ShardTensorSpec(mesh, {Shard(0)}, {11}, c10::kFloat));
  EXPECT_EQ(ShardTensorSpec(mesh, {Shard(-1)}, {2, 8}, c10::kFloat), ShardTensorSpec(mesh, {Shard(1)}, {2, 8}, c10::kFloat));
  ShardTensorSpec copy = a;  // copies share one immutable block
  EXPECT_EQ(copy, a);
}

TEST(ShardTensorSpec, EvenReplicatedAndPartialQueries) {
  DeviceMesh mesh = DeviceMesh::without_comms({2, 2}, 0);
  EXPECT_TRUE(ShardTensorSpec(mesh, {Shard(0), Shard(1)}, {4, 6}, c10::kFloat).is_even());
  EXPECT_FALSE(ShardTensorSpec(mesh, {Shard(0), Shard(1)}, {4, 5}, c10::kFloat).is_even());
  EXPECT_TRUE(ShardTensorSpec(mesh, {Replicate(), Replicate()}, {3}, c10::kFloat).is_replicated());
  EXPECT_TRUE(ShardTensorSpec(mesh, {Partial(), Replicate()}, {3}, c10::kFloat).has_partial());
  EXPECT_EQ(ShardTensorSpec(mesh, {Shard(0), Partial(ReduceOp::Max)}, {10, 6}, c10::kFloat, {{0, {1, 9}}}).to_string(),
            "ShardTensorSpec([S(0), P(max)] on mesh(2x2), shape [10, 6], Float, dim 0 sizes [1, 9])");
}

TEST(ShardTensorSpec, RejectsBadLayoutsWithClearMessages) {
  DeviceMesh mesh = DeviceMesh::without_comms({2, 2}, 0);
  EXPECT_ERROR_CONTAINS(ShardTensorSpec(mesh, {Shard(0)}, {4}, c10::kFloat), "1 placements [S(0)]", "2-d mesh(2x2)",
                        "one placement per mesh dim");
  EXPECT_ERROR_CONTAINS(ShardTensorSpec(mesh, {Shard(2), Replicate()}, {4, 4}, c10::kFloat), "Shard(2)",
                        "out of range for a 2-d tensor", "[-2, 2)");
  EXPECT_ERROR_CONTAINS(ShardTensorSpec(mesh, {Shard(-3), Replicate()}, {4, 4}, c10::kFloat), "Shard(-3)");
  EXPECT_ERROR_CONTAINS(ShardTensorSpec(mesh, {Shard(0), Replicate()}, {10}, c10::kFloat, {{0, {3, 3}}}),
                        "add up to 6 but the dim has global size 10");
  EXPECT_ERROR_CONTAINS(ShardTensorSpec(mesh, {Shard(0), Replicate()}, {2}, c10::kFloat, {{0, {3, -1}}}),
                        "negative size -1");
  EXPECT_ERROR_CONTAINS(ShardTensorSpec(mesh, {Shard(0), Replicate()}, {10}, c10::kFloat, {{0, {3, 3, 4}}}),
                        "3 shard sizes [3, 3, 4]", "into 2 pieces");
  EXPECT_ERROR_CONTAINS(ShardTensorSpec(mesh, {Shard(0), Shard(0)}, {10}, c10::kFloat, {{0, {5, 5}}}),
                        "split by mesh dims (0, 1) into 4 pieces");
  EXPECT_ERROR_CONTAINS(ShardTensorSpec(mesh, {Shard(0), Replicate()}, {10, 4}, c10::kFloat, {{1, {2, 2}}}),
                        "tensor dim 1, which no placement shards");
  EXPECT_ERROR_CONTAINS(ShardTensorSpec(mesh, {Shard(0), Replicate()}, {10}, c10::kFloat, {{0, {5, 5}}, {0, {5, 5}}}),
                        "given more than once");
  ShardTensorSpec ok(mesh, {Shard(0), Replicate()}, {10}, c10::kFloat);
  EXPECT_ERROR_CONTAINS(ok.local_shape({2, 0}), "coordinate (2, 0) is outside mesh(2x2)");
}

// ZigzagShard: zigzag sizes by default and only those, one mesh dim per zigzag dim, a unit that
// divides the dim; a piece is two stretches, so there is no offset to give.
TEST(ShardTensorSpec, ZigzagShardTakesZigzagSizesAndHasNoOffsets) {
  const DeviceMesh mesh = DeviceMesh::without_comms({4}, 1);
  const ShardTensorSpec spec(mesh, {ZigzagShard(1)}, {2, 10}, c10::kFloat);
  EXPECT_EQ(to_string(spec.placements()), "[Z(1)]");
  EXPECT_EQ(spec.sharding_of(1)->sizes, (std::vector<int64_t>{3, 3, 2, 2}));  // chunks 2,2,1,1,1,1,1,1
  EXPECT_TRUE(spec.sharding_of(1)->zigzag);
  EXPECT_EQ(spec.local_shape(), (std::vector<int64_t>{2, 3}));
  EXPECT_THROW(spec.local_offsets(), c10::ValueError);
  EXPECT_NE(spec, ShardTensorSpec(mesh, {Shard(1)}, {2, 10}, c10::kFloat, {{1, {3, 3, 2, 2}}}));
  EXPECT_THROW(ShardTensorSpec(mesh, {ZigzagShard(1)}, {2, 10}, c10::kFloat, {{1, {1, 4, 2, 3}}}), c10::ValueError);
  const ShardTensorSpec units(mesh, {ZigzagShard(0, 3)}, {30}, c10::kFloat);  // [10, 3] flattened
  EXPECT_EQ(to_string(units.placements()), "[Z(0, unit=3)]");
  EXPECT_EQ(units.sharding_of(0)->sizes, (std::vector<int64_t>{9, 9, 6, 6}));
  EXPECT_THROW(ShardTensorSpec(mesh, {ZigzagShard(0, 4)}, {30}, c10::kFloat), c10::ValueError);
  const DeviceMesh grid = DeviceMesh::without_comms({2, 2}, 0);
  EXPECT_THROW(ShardTensorSpec(grid, {ZigzagShard(0), Shard(0)}, {10}, c10::kFloat), c10::ValueError);
}
