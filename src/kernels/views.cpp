// Views with global size arguments: the kernels of the plans in rules/views.h (the rule file
// says which layouts keep a dim sharded).
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include "kernels/stack.h"
#include <c10/util/strides.h>

#include "rules/views.h"

namespace shardtensor {

LocalKernel LocalSizesPlan::lower(const KernelMoves& moves) const {
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

namespace {
// A kernel of the first argument's piece alone, run on the boxed stack.
LocalKernel on_the_stack(PieceKernel piece_kernel, int64_t num_args) {
  return [piece_kernel = std::move(piece_kernel), num_args](const c10::OperatorHandle&, torch::jit::Stack* stack) {
    at::Tensor self = (*stack)[stack->size() - num_args].toTensor();
    torch::jit::drop(*stack, num_args);
    stack->emplace_back(piece_kernel(self));
  };
}
}  // namespace

PieceKernel LocalReshapePlan::lower_for_piece() const {
  return [rewrites = rewrites, oshape = shape](const at::Tensor& self) {
    c10::SmallVector<int64_t, 5> sizes(oshape.begin(), oshape.end());
    for (const SizeFromInput& w : rewrites) sizes[w.out_dim] = self.size(w.in_dim) * w.num / w.den;
    return self.reshape(sizes);
  };
}

LocalKernel LocalReshapePlan::lower(const KernelMoves& moves) const { return on_the_stack(lower_for_piece(), num_args); }

PieceKernel SqueezePlan::lower_for_piece() const {
  return [dropped = dropped](const at::Tensor& self) {
    at::Tensor out = dropped.empty() ? self.view(self.sizes()) : self;
    for (auto it = dropped.rbegin(); it != dropped.rend(); ++it) out = out.squeeze(*it);
    return out;
  };
}

LocalKernel SqueezePlan::lower(const KernelMoves& moves) const { return on_the_stack(lower_for_piece(), num_args); }

}  // namespace shardtensor
