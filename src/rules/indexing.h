// The plan of gather_backward (rules/indexing.cpp declares it, kernels/indexing.cpp runs it).
#pragma once

#include <optional>

#include "rules/kernel_plan.h"

namespace shardtensor {

// gather_backward(grad, self, dim, index, sparse_grad): libtorch builds plain zeros of self's
// size; here each rank scatters its gradient rows into zeros of its own piece. With
// `split_self`, self's `dim` is split over some mesh dims (the gather answered each rank's own
// range: see Note [Lookups along a split dim] in rules/embedding.h) and grad and index are whole
// there: each rank adds only the entries that fall in its own range, shifted to local positions.
struct GatherBackwardPlan : KernelPlan {
  int64_t dim = 0;                            // the gathered dim, wrapped (whole without split_self)
  std::optional<ShardTensorSpec> split_self;  // self as the op runs on it, where `dim` is split

  explicit GatherBackwardPlan(int64_t d, std::optional<ShardTensorSpec> s = std::nullopt) : dim(d), split_self(std::move(s)) {}

  LocalKernel lower(const KernelMoves& moves) const override;
  std::string name() const override {
    return split_self ? "gather backward into the local range of the split dim" : "gather backward into the local piece";
  }
};

}  // namespace shardtensor
