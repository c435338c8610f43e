// The losses' means over sharded rows: the kernels of the plans in rules/loss.h.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include "domain/kernel_moves.h"
#include "kernels/stack.h"
#include "rules/loss.h"

namespace shardtensor {

constexpr int64_t kReductionSum = 2;  // at::Reduction::Sum

// Runs the op with reduction=sum, then divides output 0 by `count`.
LocalKernel SumThenDividePlan::lower(const KernelMoves& moves) const {
  return [count = count](const c10::OperatorHandle& op, torch::jit::Stack* stack) {
    OpArguments args(op, stack);
    args.set("reduction", kReductionSum);
    std::move(args).call(op, stack);
    stack->back().toTensor().div_(static_cast<double>(count));
  };
}

// Mean over sharded rows: local sums, the total weight all-reduced, then divided by it.
LocalKernel NllGlobalMeanPlan::lower(const KernelMoves& moves) const {
  return [sums = moves](const c10::OperatorHandle& op, torch::jit::Stack* stack) {
    OpArguments args(op, stack);
    args.set("reduction", kReductionSum);
    std::move(args).call(op, stack);
    at::Tensor total_weight = (*stack)[stack->size() - 1].toTensor();  // outputs: (output, total_weight)
    at::Tensor output = (*stack)[stack->size() - 2].toTensor();
    sums.all_reduce(total_weight);
    output.div_(total_weight);
  };
}

}  // namespace shardtensor
