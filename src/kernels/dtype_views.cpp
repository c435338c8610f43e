// The kernel of ResolvedBitsPlan (rules/dtype_views.h).
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include "rules/dtype_views.h"

namespace shardtensor {

LocalKernel ResolvedBitsPlan::lower(const KernelMoves& moves) const {
  return [](const c10::OperatorHandle& op, torch::jit::Stack* stack) {
    op.callBoxed(stack);
    stack->back() = stack->back().toTensor().resolve_conj().resolve_neg();
  };
}

}  // namespace shardtensor
