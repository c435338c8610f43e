// EmptySafePlan (rules/spatial.h): a rank whose piece is empty runs its op on stand-ins.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include "kernels/stack.h"
#include "rules/spatial.h"

namespace shardtensor {

LocalKernel EmptySafePlan::lower(const KernelMoves& moves) const {
  const LocalKernel run = inner ? inner->lower(moves) : LocalKernel{};
  return [run, follows = follows](const c10::OperatorHandle& op, torch::jit::Stack* stack) {
    const size_t n = op.schema().arguments().size(), begin = stack->size() - n;
    const at::Tensor first = (*stack)[begin].toTensor();
    std::vector<int64_t> empty_dims;
    for (int64_t d = 0; d < first.dim(); ++d)
      if (first.size(d) == 0) empty_dims.push_back(d);
    if (!empty_dims.empty()) {
      for (size_t i = begin; i < stack->size(); ++i) {
        if (!(*stack)[i].isTensor() || !(*stack)[i].toTensor().defined()) continue;
        const at::Tensor t = (*stack)[i].toTensor();
        std::vector<int64_t> shape = t.sizes().vec();
        for (int64_t d : empty_dims)
          if (d < t.dim() && shape[d] == 0) shape[d] = 1;
        (*stack)[i] = at::zeros(shape, t.options());
      }
    }
    const size_t returns = op.schema().returns().size();
    if (run) run(op, stack);
    else op.callBoxed(stack);
    const size_t first_return = stack->size() - returns;
    for (size_t i = first_return; i < stack->size() && !empty_dims.empty(); ++i) {
      if (!(*stack)[i].isTensor() || !(*stack)[i].toTensor().defined()) continue;
      const Follows how = follows.empty() ? Follows::AllDims : follows.at(i - first_return);
      at::Tensor t = (*stack)[i].toTensor();
      for (int64_t d : empty_dims)
        if (d < t.dim() && (how == Follows::AllDims || (how == Follows::BatchDim && d == 0))) t = t.narrow(d, 0, 0);
      (*stack)[i] = t.contiguous();
    }
  };
}

}  // namespace shardtensor
