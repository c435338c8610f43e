// The plans of the losses' means (rules/loss.cpp declares them, kernels/loss.cpp runs them).
#pragma once

#include "rules/kernel_plan.h"

namespace shardtensor {

// A mean over sharded elements with a known count (mse_loss and its backward): the op runs
// with reduction=sum, then output 0 is divided by the GLOBAL count. Local: the forward's
// result is Partial(sum), resolved like any other.
struct SumThenDividePlan : KernelPlan {
  int64_t count = 1;  // elements, globally

  explicit SumThenDividePlan(int64_t n) : count(n) {}

  LocalKernel lower(const KernelMoves& moves) const override;
  std::string name() const override { return "sum over the global count"; }
};

// nll_loss's mean over sharded rows: its count is data-dependent (ignored targets, class
// weights), so each rank computes local sums, the total weight is all-reduced over
// `mesh_dims` (one scalar), and the output divided by it.
struct NllGlobalMeanPlan : KernelPlan {
  DeviceMesh mesh;
  std::vector<int64_t> mesh_dims;  // the mesh dims that shard self's rows

  NllGlobalMeanPlan(DeviceMesh m, std::vector<int64_t> dims) : mesh(std::move(m)), mesh_dims(std::move(dims)) {}

  LocalKernel lower(const KernelMoves& moves) const override;
  std::string name() const override { return "nll loss mean over the global total weight"; }
  std::vector<MoveStep> moves() const override { return sums_over(mesh, mesh_dims); }
  MoveLowering move_lowering() const override { return {mesh}; }
};

}  // namespace shardtensor
