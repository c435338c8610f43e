// The losses' means over sharded rows: the kernels of the plans in rules/loss.h.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include "redistribute/executor.h"
#include "rules/loss.h"

namespace shardtensor {

// Runs the op with reduction=sum (argument `reduction_arg`), then divides output 0 by `count`.
LocalKernel SumThenDividePlan::lower() const {
  return [reduction_arg = reduction_arg, count = count](const c10::OperatorHandle& op, torch::jit::Stack* stack) {
    const size_t begin = stack->size() - op.schema().arguments().size();
    (*stack)[begin + reduction_arg] = c10::IValue(int64_t{2});  // Reduction::Sum
    op.callBoxed(stack);
    stack->back().toTensor().div_(static_cast<double>(count));
  };
}

// Mean over sharded rows: local sums, the total weight all-reduced, then divided by it.
LocalKernel NllGlobalMeanPlan::lower() const {
  return [mesh = mesh, mesh_dims = mesh_dims](const c10::OperatorHandle& op, torch::jit::Stack* stack) {
    const size_t begin = stack->size() - op.schema().arguments().size();
    (*stack)[begin + 3] = c10::IValue(int64_t{2});  // Reduction::Sum
    op.callBoxed(stack);
    at::Tensor total_weight = (*stack)[stack->size() - 1].toTensor();
    at::Tensor output = (*stack)[stack->size() - 2].toTensor();
    all_reduce_over(mesh, mesh_dims, total_weight, ReduceOp::Sum);
    output.div_(total_weight);
  };
}

}  // namespace shardtensor
