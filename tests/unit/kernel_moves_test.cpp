// A kernel's declared moves lowered into one value in one process (domain/kernel_moves.h): the
// lowered steps are the declared ones, in order; a declaration the lowering cannot place (a
// halo step on no axis, or on an axis whose windows cross no shard) is refused when the kernel
// is lowered; and a kernel that runs a halo move its plan did not declare is stopped before any
// byte moves.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <string>
#include <vector>

#include "domain/kernel_moves.h"

using namespace shardtensor;

namespace {

// The axis of a window reaching one position past each side of a rank's rows, over `sizes`.
HaloAxis sliding_axis(const std::vector<int64_t>& sizes, int64_t tensor_dim) {
  HaloAxis axis;
  axis.tensor_dim = tensor_dim;
  axis.mesh_dim = 0;
  axis.owned = sizes_to_ranges(sizes);
  axis.length = axis.owned.back().end;
  for (const Range& r : axis.owned) axis.window.push_back({r.begin - 1, r.end + 1});
  return axis;
}

// The same axis with windows that stay inside each rank's rows: no exchange.
HaloAxis local_axis(const std::vector<int64_t>& sizes, int64_t tensor_dim) {
  HaloAxis axis = sliding_axis(sizes, tensor_dim);
  axis.window = axis.owned;
  return axis;
}

std::vector<std::string> printed(const std::vector<MoveStep>& steps) {
  std::vector<std::string> out;
  for (const MoveStep& s : steps) out.push_back(to_string(s));
  return out;
}

std::vector<std::string> printed(const KernelMoves& moves) {
  std::vector<std::string> out;
  for (const LoweredStep& s : moves.steps()) out.push_back(to_string(s.step()));
  return out;
}

TEST(KernelMoves, LowersTheDeclaredStepsInOrder) {
  for (int64_t rank = 0; rank < 3; ++rank) {
    const DeviceMesh mesh = DeviceMesh::without_comms({3}, rank);
    const HaloPlan halo{mesh, {sliding_axis({4, 0, 5}, 2), local_axis({3, 3, 3}, 3), sliding_axis({1, 1, 7}, 4)}};
    std::vector<MoveStep> declared = halo_gathers(halo);
    for (const MoveStep& m : halo_scatter_adds(halo)) declared.push_back(m);
    declared.push_back(AllReduceStep{0, ReduceOp::Sum});
    const KernelMoves moves(declared, {mesh, halo.axes});
    EXPECT_EQ(printed(moves), printed(declared)) << "rank " << rank;
    EXPECT_EQ(moves.halo_axes(), 3u);
    EXPECT_TRUE(moves.reduces());
    EXPECT_FALSE(moves.halo_axis(1).exchanges) << "the axis whose windows stay home is no declared step, but is lowered";
  }
}

TEST(KernelMoves, LowersEachRingPhaseWithItsBatches) {
  const DeviceMesh mesh = DeviceMesh::without_comms({2}, 1);
  MoveLowering how{mesh};
  how.widest_ring_rows = 5;
  how.ring_batches = [](RingPhase phase) {
    return std::vector<RingBatch>(phase == RingPhase::Pass ? 1 : 2, RingBatch{{{0, 1, 5}}, {{0, 0, 4}}});
  };
  const KernelMoves moves({RingStep{RingPhase::Pass, 0, 2, 1}, RingStep{RingPhase::GradientPass, 0, 2, 2}}, how);
  EXPECT_TRUE(moves.declares_ring(RingPhase::Pass));
  EXPECT_TRUE(moves.declares_ring(RingPhase::GradientPass));
  EXPECT_FALSE(moves.declares_ring(RingPhase::Return));
  EXPECT_EQ(moves.ring_batch(RingPhase::GradientPass, 1).sends.at(0).rows, 5);
  EXPECT_THROW(moves.ring_batch(RingPhase::Return, 0), c10::Error);

}

TEST(KernelMoves, RefusesDeclarationsItCannotPlace) {
  const DeviceMesh mesh = DeviceMesh::without_comms({3}, 0);
  const std::vector<HaloAxis> axes = {sliding_axis({4, 4, 4}, 2), local_axis({3, 3, 3}, 3)};
  // On no axis of the halo.
  EXPECT_THROW(KernelMoves({HaloGatherStep{0, 5}}, {mesh, axes}), c10::Error);
  // On an axis whose windows cross no shard: explain would print a move that never runs.
  EXPECT_THROW(KernelMoves({HaloGatherStep{0, 3}}, {mesh, axes}), c10::Error);
  // Moves without a mesh to run them on.
  EXPECT_THROW(KernelMoves({AllReduceStep{0, ReduceOp::Sum}}, MoveLowering{}), c10::Error);
  // A redistribute step is not a kernel's.
  EXPECT_THROW(KernelMoves({AllGatherStep{0, 0}}, {mesh}), c10::Error);
}

TEST(KernelMoves, AKernelCannotRunAnUndeclaredHaloMove) {
  const DeviceMesh mesh = DeviceMesh::without_comms({3}, 1);
  const HaloPlan halo{mesh, {sliding_axis({4, 4, 4}, 0)}};
  const KernelMoves gathers_only(halo_gathers(halo), {mesh, halo.axes});
  // The window is 6 rows; its scatter-add was not declared, so it stops before moving anything.
  try {
    gathers_only.scatter_add_window(0, at::zeros({6}));
    ADD_FAILURE() << "ran an undeclared scatter-add";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("which its plan does not declare"), std::string::npos) << e.what();
  }
}

}  // namespace
