// Placements: printing like DTensor's short form, equality and hashing.
#include <gtest/gtest.h>

#include <unordered_set>

#include "shardtensor/placement.h"

using namespace shardtensor;

TEST(Placement, PrintsShortForm) {
  EXPECT_EQ(to_string(Shard(0)), "S(0)");
  EXPECT_EQ(to_string(Replicate()), "R");
  EXPECT_EQ(to_string(Partial()), "P(sum)");
  EXPECT_EQ(to_string(Partial(ReduceOp::Avg)), "P(avg)");
  EXPECT_EQ(to_string(Partial(ReduceOp::Max)), "P(max)");
  EXPECT_EQ(to_string(Partial(ReduceOp::Min)), "P(min)");
  EXPECT_EQ(to_string(Partial(ReduceOp::Product)), "P(product)");
  EXPECT_EQ(to_string(Placements{Shard(1), Replicate(), Partial()}), "[S(1), R, P(sum)]");
}

TEST(Placement, EqualityComparesOnlyTheFieldsOfItsKind) {
  EXPECT_EQ(Shard(1), Shard(1));
  EXPECT_NE(Shard(0), Shard(1));
  EXPECT_EQ(Replicate(), Replicate());
  EXPECT_NE(Partial(ReduceOp::Sum), Partial(ReduceOp::Max));
  EXPECT_NE(Shard(0), Replicate());
  EXPECT_NE(Replicate(), Partial());
}

TEST(Placement, HashSeparatesDistinctPlacements) {
  std::unordered_set<Placement> set = {Shard(0), Shard(1), Replicate(), Partial(), Partial(ReduceOp::Max), Shard(0)};
  EXPECT_EQ(set.size(), 5u);
}
