// A mean over sharded dims: the kernel of GlobalMeanPlan (rules/reduction.h).
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include "rules/reduction.h"

#include <algorithm>
#include <limits>

namespace shardtensor {

// Each rank's local mean, rescaled to (local sum) / (global count).
LocalKernel GlobalMeanPlan::lower(const KernelMoves& moves) const {
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

namespace {

at::Scalar identity_of(at::ScalarType type, bool is_max) {
  if (at::isFloatingType(type)) return is_max ? -std::numeric_limits<double>::infinity() : std::numeric_limits<double>::infinity();
  if (type == at::kBool) return !is_max;
  switch (type) {
    case at::kByte: return is_max ? int64_t{0} : int64_t{std::numeric_limits<uint8_t>::max()};
    case at::kChar: return is_max ? int64_t{std::numeric_limits<int8_t>::lowest()} : int64_t{std::numeric_limits<int8_t>::max()};
    case at::kShort: return is_max ? int64_t{std::numeric_limits<int16_t>::lowest()} : int64_t{std::numeric_limits<int16_t>::max()};
    case at::kInt: return is_max ? int64_t{std::numeric_limits<int32_t>::lowest()} : int64_t{std::numeric_limits<int32_t>::max()};
    default: return is_max ? std::numeric_limits<int64_t>::lowest() : std::numeric_limits<int64_t>::max();
  }
}

}  // namespace

// A rank with elements reduces them; one with none holds the identity in the output's shape.
LocalKernel EmptyExtremumPlan::lower(const KernelMoves& moves) const {
  return [dims = dims, keepdim = keepdim, is_max = is_max](const c10::OperatorHandle& op, torch::jit::Stack* stack) {
    const size_t num_args = op.schema().arguments().size();
    const at::Tensor self = (*stack)[stack->size() - num_args].toTensor();
    int64_t local_count = 1;
    for (int64_t d : dims) local_count *= self.size(d);
    if (local_count != 0) return op.callBoxed(stack);
    std::vector<int64_t> shape;
    for (int64_t d = 0; d < self.dim(); ++d) {
      const bool reduced = std::find(dims.begin(), dims.end(), d) != dims.end();
      if (!reduced) shape.push_back(self.size(d));
      else if (keepdim) shape.push_back(1);
    }
    at::Tensor out = at::full(shape, identity_of(self.scalar_type(), is_max), self.options());
    torch::jit::drop(*stack, num_args);
    stack->push_back(std::move(out));
  };
}

}  // namespace shardtensor
