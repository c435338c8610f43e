// The kernel of ContributedOncePlan (rules/contribution.h): on ranks off coordinate 0 of a
// Partial(sum) mesh dim, the replicated values become zeros of the same shape and type.
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/zeros.h>

#include "rules/contribution.h"

namespace shardtensor {
namespace {

// A zero in place of `value`. A tensor keeps its shape (a broadcast operand still shapes the
// result) through an expanded 0-d zero, so nothing is allocated.
c10::IValue zero_like(const c10::IValue& value) {
  if (value.isTensor()) {
    const at::Tensor& t = value.toTensor();
    return t.defined() ? at::zeros({}, t.options()).expand(t.sizes()) : t;
  }
  if (value.isDouble()) return 0.0;
  if (value.isInt()) return int64_t{0};
  if (value.isBool()) return false;
  if (value.isComplexDouble()) return c10::complex<double>(0, 0);
  TORCH_INTERNAL_ASSERT(value.isNone(), "contributed once: cannot zero an argument of type ", value.tagKind());
  return value;
}

}  // namespace

LocalKernel ContributedOncePlan::lower(const KernelMoves& moves) const {
  return [mesh = mesh, values = values](const c10::OperatorHandle& op, torch::jit::Stack* stack) {
    const size_t args_begin = stack->size() - op.schema().arguments().size();
    for (const ContributedValue& v : values) {
      bool contributes = true;
      for (int64_t m : v.mesh_dims) contributes = contributes && mesh.coordinate()[m] == 0;
      if (contributes) continue;
      c10::IValue& arg = (*stack)[args_begin + v.arg];
      if (v.element < 0) {
        arg = zero_like(arg);
        continue;
      }
      // One tensor of a list: a new list, so that no list the caller holds changes.
      std::vector<at::Tensor> tensors = arg.toTensorVector();
      at::Tensor& t = tensors[static_cast<size_t>(v.element)];
      t = zero_like(t).toTensor();
      arg = tensors;
    }
    op.callBoxed(stack);
  };
}

}  // namespace shardtensor
