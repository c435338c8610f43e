// The plan of _conj and _neg_view on ShardTensors (rules/dtype_views.cpp declares it,
// kernels/dtype_views.cpp runs it).
#pragma once

#include "rules/kernel_plan.h"

namespace shardtensor {

// The operator on the local piece, then its conjugate or negative bit resolved: the wrapper
// carries no such bit, and the transport moves stored values, so the piece holds the values
// it means. A copy, not a view.
struct ResolvedBitsPlan : KernelPlan {
  LocalKernel lower(const KernelMoves& moves) const override;
  std::string name() const override { return "view with its conj/neg bit resolved"; }
};

}  // namespace shardtensor
