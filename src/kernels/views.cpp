// Views with global size arguments: the kernels of the plans in rules/views.h (the rule file
// says which layouts keep a dim sharded).
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include "kernels/stack.h"
#include <c10/util/strides.h>

#include "rules/views.h"

namespace shardtensor {

LocalKernel LocalSizesPlan::lower() const {
  return [size_arg = size_arg, in_arg = in_arg, rewrites = rewrites, stride_arg = stride_arg](const c10::OperatorHandle& op,
                                                                                              torch::jit::Stack* stack) {
    const size_t begin = stack->size() - op.schema().arguments().size();
    const at::Tensor in = (*stack)[begin + in_arg].toTensor();
    std::vector<int64_t> sizes = (*stack)[begin + size_arg].toIntVector();
    for (const SizeFromInput& r : rewrites) sizes[r.out_dim] = in.size(r.in_dim) * r.num / r.den;
    (*stack)[begin + size_arg] = c10::IValue(sizes);
    if (stride_arg) {
      const c10::DimVector strides = c10::contiguous_strides(sizes);
      (*stack)[begin + *stride_arg] = c10::IValue(std::vector<int64_t>(strides.begin(), strides.end()));
    }
    op.callBoxed(stack);
  };
}

LocalKernel LocalReshapePlan::lower() const {
  return [rewrites = rewrites, oshape = shape, num_args = num_args](const c10::OperatorHandle&, torch::jit::Stack* stack) {
    at::Tensor self = (*stack)[stack->size() - num_args].toTensor();
    std::vector<int64_t> sizes = oshape;
    for (const SizeFromInput& w : rewrites) sizes[w.out_dim] = self.size(w.in_dim) * w.num / w.den;
    torch::jit::drop(*stack, num_args);
    stack->emplace_back(self.reshape(sizes));
  };
}

LocalKernel SqueezePlan::lower() const {
  return [dropped = dropped, num_args = num_args](const c10::OperatorHandle&, torch::jit::Stack* stack) {
    at::Tensor out = (*stack)[stack->size() - num_args].toTensor();
    torch::jit::drop(*stack, num_args);
    if (dropped.empty()) out = out.view(out.sizes());
    for (auto it = dropped.rbegin(); it != dropped.rend(); ++it) out = out.squeeze(*it);
    stack->emplace_back(out);
  };
}

}  // namespace shardtensor
