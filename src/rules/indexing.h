// The plan of gather_backward (rules/indexing.cpp declares it, kernels/indexing.cpp runs it).
#pragma once

#include "rules/kernel_plan.h"

namespace shardtensor {

// gather_backward(grad, self, dim, index, sparse_grad): libtorch builds plain zeros of self's
// size; here each rank scatters its gradient rows into zeros of its own piece.
struct GatherBackwardPlan : KernelPlan {
  int64_t dim = 0;  // the gathered (whole) dim, wrapped

  explicit GatherBackwardPlan(int64_t d) : dim(d) {}

  LocalKernel lower() const override;
  std::string name() const override { return "gather backward into the local piece"; }
};

}  // namespace shardtensor
