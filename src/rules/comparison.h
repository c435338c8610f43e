// Whole-tensor comparisons that answer a bool: is_same_size and equal. The plans' kernels are
// in kernels/comparison.cpp.
#pragma once

#include "rules/kernel_plan.h"

namespace shardtensor {

// An answer every rank knows from the specs alone (is_same_size; equal of different shapes):
// the arguments are dropped and the answer pushed, with no local call and no communication.
struct KnownAnswerPlan : KernelPlan {
  bool answer = false;

  explicit KnownAnswerPlan(bool a) : answer(a) {}

  LocalKernel lower(const KernelMoves& moves) const override;
  std::string name() const override { return answer ? "known answer (true)" : "known answer (false)"; }
};

// equal of operands laid out alike: each rank compares its pieces, then one all-reduce of a
// flag over the mesh dims that shard them gives every rank the global answer.
struct GlobalEqualPlan : KernelPlan {
  DeviceMesh mesh;
  std::vector<int64_t> mesh_dims;  // those sharding the operands

  GlobalEqualPlan(DeviceMesh m, std::vector<int64_t> dims) : mesh(std::move(m)), mesh_dims(std::move(dims)) {}

  LocalKernel lower(const KernelMoves& moves) const override;
  std::string name() const override { return "equal over shards"; }
  std::vector<MoveStep> moves() const override { return sums_over(mesh, mesh_dims); }
  MoveLowering move_lowering() const override { return {mesh}; }
};

}  // namespace shardtensor
