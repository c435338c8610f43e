// The plan of a mean over sharded dims (rules/reduction.cpp declares it, kernels/reduction.cpp
// runs it).
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

  LocalKernel lower(const KernelMoves& moves) const override;
  std::string name() const override { return "global mean"; }
};

// amax/amin (and max/min of the whole tensor) over a sharded dim with an empty piece: the
// result is still a pending max (min), and a rank with no element along the reduced dims
// holds the reduction's identity (-inf / +inf, or the integer type's limit), where libtorch
// would refuse the reduction of an empty tensor.
struct EmptyExtremumPlan : KernelPlan {
  std::vector<int64_t> dims;  // the reduced dims of the input
  bool keepdim = false;
  bool is_max = true;

  EmptyExtremumPlan(std::vector<int64_t> d, bool keep, bool max) : dims(std::move(d)), keepdim(keep), is_max(max) {}

  LocalKernel lower(const KernelMoves& moves) const override;
  std::string name() const override { return is_max ? "max with empty pieces" : "min with empty pieces"; }
};

}  // namespace shardtensor
