// gather_backward on the local pieces: the kernel of GatherBackwardPlan (rules/indexing.h).
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include "kernels/stack.h"
#include "rules/indexing.h"

namespace shardtensor {

LocalKernel GatherBackwardPlan::lower() const {
  return [dim = dim](const c10::OperatorHandle& op, torch::jit::Stack* stack) {
    const std::vector<c10::IValue> args = pop_arguments(op, stack);
    const at::Tensor grad = args[0].toTensor(), self = args[1].toTensor(), index = args[3].toTensor();
    stack->push_back(at::zeros(self.sizes(), grad.options()).scatter_add_(dim, index, grad));
  };
}

}  // namespace shardtensor
