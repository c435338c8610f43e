// gather_backward on the local pieces: the kernel of GatherBackwardPlan (rules/indexing.h).
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include "kernels/stack.h"
#include "rules/indexing.h"

namespace shardtensor {

LocalKernel GatherBackwardPlan::lower(const KernelMoves& moves) const {
  return [dim = dim, split_self = split_self](const c10::OperatorHandle& op, torch::jit::Stack* stack) {
    const OpArguments args(op, stack);
    const at::Tensor grad = args.tensor("grad"), self = args.tensor("self"), index = args.tensor("index");
    at::Tensor result = at::zeros(self.sizes(), grad.options());
    if (!split_self) {
      stack->push_back(result.scatter_add_(dim, index, grad));
      return;
    }
    // See Note [Lookups along a split dim]: global position i is local position i - first; the
    // entries of other ranks' ranges add a zero at local position 0 (masked_fill, so that an inf
    // in their gradient leaves no NaN). An empty piece takes nothing.
    const int64_t first = split_self->local_offsets()[dim], size = self.size(dim);
    if (size > 0) {
      const at::Tensor local = index - first;
      const at::Tensor elsewhere = at::logical_or(local < 0, local >= size);
      result.scatter_add_(dim, local.masked_fill(elsewhere, 0), grad.masked_fill(elsewhere, 0));
    }
    stack->push_back(result);
  };
}

}  // namespace shardtensor
