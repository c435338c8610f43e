// An error raised on one rank only must not leave the others waiting forever: they raise once
// the mesh's collective timeout passes. Kept in its own binary because the timed-out group is
// left unusable.
#include <ATen/ATen.h>

#include <chrono>

#include "comm/comm.h"
#include "dist/dist_fixture.h"

using namespace shardtensor;
using namespace shardtensor::testing;

TEST(Failure, RanksWaitingForARankThatFailedRaiseAfterTheTimeout) {
  if (world_size() == 1) GTEST_SKIP() << "needs a rank that fails and one that waits";
  DeviceMesh healthy = DeviceMesh::create({world_size()});
  MeshOptions short_timeout;
  short_timeout.timeout = std::chrono::seconds(3);
  DeviceMesh mesh = DeviceMesh::create({world_size()}, {}, short_timeout);
  const auto start = std::chrono::steady_clock::now();
  if (world_rank() != 0) {
    // Rank 0 "failed" before this call and never joins the all-gather of local shapes.
    EXPECT_ERROR_CONTAINS(from_local(at::zeros({2}), mesh, {Shard(0)}, ShardSizing::infer()), "failed or timed out",
                          "all_gather");
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_LT(waited, 30.0);
  }
  healthy.comm(0).barrier();  // rank 0 stays alive until the others have seen their error
}
