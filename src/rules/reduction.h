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

  LocalKernel lower() const override;
  std::string name() const override { return "global mean"; }
};

}  // namespace shardtensor
