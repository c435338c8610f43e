// The plans of a mean and of a vector norm over sharded dims (rules/reduction.cpp declares
// them, kernels/reduction.cpp runs them).
#pragma once

#include "rules/kernel_plan.h"

namespace shardtensor {

// mean over a sharded dim: each rank's local mean, rescaled to (local sum) / (global count),
// so that the Partial(sum) of the pieces is the mean (uneven shards make an average of
// averages wrong). Local: the Partial(sum) output is resolved like any other.
struct GlobalMeanPlan : KernelPlan {
  std::vector<int64_t> dims;  // the reduced dims of the input
  int64_t global_count = 1;   // elements reduced into each output element, globally

  GlobalMeanPlan(std::vector<int64_t> d, int64_t count) : dims(std::move(d)), global_count(count) {}

  LocalKernel lower() const override;
  std::string name() const override { return "global mean"; }
};

// A p-norm over sharded dims: each rank's local norm n_r, then one all-reduce of the output
// over the mesh dims that shard the reduced dims: (sum n_r^p)^(1/p) for a finite p other than
// 0, the sum for p = 0 (a count), the max for +inf, the min for -inf. One output-sized
// collective instead of gathering the input (DTensor's _NormPartial). The output is Replicate
// there; autograd's norm formula then runs on the sharded input and the replicated norm.
struct VectorNormPlan : KernelPlan {
  DeviceMesh mesh;
  std::vector<int64_t> mesh_dims;  // those sharding a reduced dim
  double p = 2;

  VectorNormPlan(DeviceMesh m, std::vector<int64_t> dims, double order) : mesh(std::move(m)), mesh_dims(std::move(dims)), p(order) {}

  // How the local norms combine: max/min for the infinite orders, a sum otherwise (of the
  // p-th powers for p other than 0). The kernel and moves() both read it.
  ReduceOp combine_op() const;

  LocalKernel lower() const override;
  std::string name() const override { return "vector norm over shards"; }
  std::vector<DeclaredMove> moves() const override { return all_reduces_over(mesh_dims, combine_op()); }
};

}  // namespace shardtensor
