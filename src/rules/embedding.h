// The plan of a lookup in a vocabulary-sharded table (rules/embedding.cpp declares it,
// kernels/embedding.cpp runs it).
#pragma once

#include "rules/kernel_plan.h"

namespace shardtensor {

// embedding(weight, indices, ...) with the table's rows (dim 0) split over some mesh dims and
// the indices whole there (DTensor's MaskPartial): each rank looks up the indices that fall in
// its own rows [offset, offset + rows) and writes zeros for the others, so the output is a
// pending sum over those mesh dims with no communication. Which rank holds an index is read
// from the values by the kernel; the rule never sees them.
struct VocabShardedLookupPlan : KernelPlan {
  ShardTensorSpec table;  // the weight as the op runs on it: this rank's rows come from it
  size_t weight_arg = 0;  // schema positions of weight and indices
  size_t indices_arg = 1;

  VocabShardedLookupPlan(ShardTensorSpec t, size_t w, size_t i) : table(std::move(t)), weight_arg(w), indices_arg(i) {}

  LocalKernel lower() const override;
  std::string name() const override { return "embedding of the local vocabulary rows (others zero)"; }
};

}  // namespace shardtensor
