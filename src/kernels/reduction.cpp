// A mean over sharded dims: the kernel of GlobalMeanPlan (rules/reduction.h).
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include "rules/reduction.h"

namespace shardtensor {

// Each rank's local mean, rescaled to (local sum) / (global count).
LocalKernel GlobalMeanPlan::lower() const {
  return [dims = dims, global_count = global_count](const c10::OperatorHandle& op, torch::jit::Stack* stack) {
    const size_t num_args = op.schema().arguments().size();
    const at::Tensor self = (*stack)[stack->size() - num_args].toTensor();
    int64_t local_count = 1;
    for (int64_t d : dims) local_count *= self.size(d);
    op.callBoxed(stack);
    at::Tensor out = stack->back().toTensor();
    if (local_count == 0) {
      out.zero_();
    } else {
      out.mul_(static_cast<double>(local_count) / static_cast<double>(global_count));
    }
  };
}

}  // namespace shardtensor
