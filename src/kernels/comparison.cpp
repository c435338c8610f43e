// The kernels of KnownAnswerPlan and GlobalEqualPlan (rules/comparison.h).
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include "domain/kernel_moves.h"
#include "kernels/stack.h"
#include "rules/comparison.h"

namespace shardtensor {

LocalKernel KnownAnswerPlan::lower(const KernelMoves& moves) const {
  return [answer = answer](const c10::OperatorHandle& op, torch::jit::Stack* stack) {
    pop_arguments(op, stack);
    stack->push_back(answer);
  };
}

LocalKernel GlobalEqualPlan::lower(const KernelMoves& moves) const {
  return [device = mesh.device(), sums = moves](const c10::OperatorHandle& op, torch::jit::Stack* stack) {
    op.callBoxed(stack);
    const bool here = stack->back().toBool();
    at::Tensor differs = at::full({1}, here ? 0.0 : 1.0, at::TensorOptions().dtype(at::kFloat).device(device));
    sums.all_reduce(differs);
    stack->back() = differs.item<float>() == 0;
  };
}

}  // namespace shardtensor
