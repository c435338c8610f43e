// The planner is pure: plans are compared as strings on meshes without communicators.
#include <gtest/gtest.h>

#include "redistribute/plan.h"
#include "support/reference.h"

using namespace shardtensor;

namespace {
ShardTensorSpec make(const std::vector<int64_t>& mesh_shape, Placements ps, std::vector<int64_t> shape, ShardSizes sizes = {}) {
  return ShardTensorSpec(DeviceMesh::without_comms(mesh_shape, 0), std::move(ps), std::move(shape), c10::kFloat, sizes);
}
std::string plan(const ShardTensorSpec& a, const ShardTensorSpec& b) { return plan_redistribute(a, b).to_string(); }
}  // namespace

TEST(RedistributePlanner, SameSpecIsNoWork) {
  auto s = make({4}, {Shard(0)}, {10});
  EXPECT_EQ(plan(s, s), "(no work)");
}

TEST(RedistributePlanner, ReplicateToShardIsALocalSlice) {
  EXPECT_EQ(plan(make({4}, {Replicate()}, {10}), make({4}, {Shard(0)}, {10})), "LocalSlice()");
}

TEST(RedistributePlanner, ShardToReplicateOnUnevenDimIsOneExchangeOfWhatEachRankLacks) {
  // 10 rows as 3,3,3,1: the rank holding 1 row receives the other 9 rows of 6 columns.
  EXPECT_EQ(plan(make({4}, {Shard(0)}, {10, 6}), make({4}, {Replicate()}, {10, 6})), "Exchange(mesh_dims=[0], max_received=54)");
}

TEST(RedistributePlanner, RebalancingExplicitSizesIsOneExchange) {
  EXPECT_EQ(plan(make({4}, {Shard(0)}, {10}, {{0, {1, 4, 2, 3}}}), make({4}, {Shard(0)}, {10}, {{0, {3, 3, 2, 2}}})),
            "Exchange(mesh_dims=[0], max_received=2)");
}

TEST(RedistributePlanner, PartialToShardIsAReduceScatterAndToReplicateAnAllReduce) {
  EXPECT_EQ(plan(make({4}, {Partial(ReduceOp::Max)}, {10}), make({4}, {Shard(0)}, {10})),
            "ReduceScatter(mesh_dim=0, tensor_dim=0, max)");
  EXPECT_EQ(plan(make({2, 2}, {Partial(), Shard(1)}, {4, 4}), make({2, 2}, {Replicate(), Shard(1)}, {4, 4})),
            "AllReduce(mesh_dim=0, sum)");
}

TEST(RedistributePlanner, PartialOuterDimUnderAnInnerShardFallsBackToAllReduce) {
  // Making mesh dim 0 the outer Shard(0) would not tile what each rank holds (its mesh-dim-1
  // chunk), so the planner reduces fully, then takes its nested piece.
  EXPECT_EQ(plan(make({2, 2}, {Partial(), Shard(0)}, {8}), make({2, 2}, {Shard(0), Shard(0)}, {8})),
            "AllReduce(mesh_dim=0, sum) -> Exchange(mesh_dims=[1], max_received=2)");
}

TEST(RedistributePlanner, ExplainShowsTheChainOfLayouts) {
  EXPECT_EQ(explain_redistribute(make({2, 2}, {Shard(0), Shard(0)}, {10, 6}), make({2, 2}, {Replicate(), Shard(0)}, {10, 6})),
            "[S(0), S(0)] -[Exchange(mesh_dims=[0, 1], max_received=30)]-> [R, S(0)]");
}

TEST(RedistributePlanner, PlansAreCachedBySpecPair) {
  auto a = make({2, 1, 2}, {Shard(0), Replicate(), Shard(1)}, {5, 7});
  auto b = make({2, 1, 2}, {Shard(1), Replicate(), Shard(0)}, {5, 7});
  EXPECT_EQ(&plan_redistribute(a, b), &plan_redistribute(a, b));
  EXPECT_EQ(plan_redistribute(a, b).to_string(), plan_redistribute_uncached(a, b).to_string());
}

TEST(RedistributeTarget, KeepsSizesOfDimsShardedAsBeforeAndRefusesNewPartials) {
  auto src = make({4}, {Shard(0)}, {10, 8}, {{0, {1, 4, 2, 3}}});
  EXPECT_EQ(redistribute_target(src, {Shard(0)}, nullptr).sharding_of(0)->sizes, (std::vector<int64_t>{1, 4, 2, 3}));
  EXPECT_EQ(redistribute_target(src, {Shard(1)}, nullptr).sharding_of(1)->sizes, (std::vector<int64_t>{2, 2, 2, 2}));
  ShardSizes given = {{0, {3, 3, 2, 2}}};
  EXPECT_EQ(redistribute_target(src, {Shard(0)}, &given).sharding_of(0)->sizes, (std::vector<int64_t>{3, 3, 2, 2}));
  EXPECT_ERROR_CONTAINS(redistribute_target(src, {Partial()}, nullptr), "cannot make P(sum)");
  EXPECT_ERROR_CONTAINS(plan_redistribute(src, make({2, 2}, {Shard(0), Replicate()}, {10, 8})), "another mesh");
}
