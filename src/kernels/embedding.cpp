// The kernel of VocabShardedLookupPlan (rules/embedding.h): a lookup in this rank's rows of a
// vocabulary-sharded table, zeros for the indices other ranks hold. The ranks' outputs add up
// to the lookup in the whole table, since every index falls in exactly one rank's rows.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include "kernels/stack.h"
#include "rules/embedding.h"

namespace shardtensor {

LocalKernel VocabShardedLookupPlan::lower() const {
  return [table = table, weight_arg = weight_arg, indices_arg = indices_arg](const c10::OperatorHandle& op,
                                                                             torch::jit::Stack* stack) {
    std::vector<c10::IValue> args = pop_arguments(op, stack);
    const at::Tensor weight = args[weight_arg].toTensor(), indices = args[indices_arg].toTensor();
    const int64_t first_row = table.local_offsets()[0], rows = weight.size(0);
    if (rows == 0) {
      // An empty piece holds no row to look up (not even a stand-in for the masked indices).
      std::vector<int64_t> shape = indices.sizes().vec();
      shape.push_back(weight.size(1));
      stack->push_back(at::zeros(shape, weight.options()));
      return;
    }
    // Global row i is local row i - first_row; indices of other ranks' rows read local row 0
    // and are zeroed after (masked_fill, not a product, so that an inf in row 0 leaves no NaN).
    const at::Tensor local = indices - first_row;
    const at::Tensor elsewhere = at::logical_or(local < 0, local >= rows);
    args[indices_arg] = local.masked_fill(elsewhere, 0);
    call_with(op, stack, std::move(args));
    at::Tensor out = stack->back().toTensor();
    out.masked_fill_(elsewhere.unsqueeze(-1), 0);
  };
}

}  // namespace shardtensor
