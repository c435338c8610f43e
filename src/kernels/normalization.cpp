// Layer norm over sharded rows: the kernels of LayerNormPlan (rules/normalization.h; the
// rule file says how the layouts are handled).
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include "domain/kernel_moves.h"
#include "kernels/stack.h"
#include "rules/normalization.h"

namespace shardtensor {
namespace {

std::vector<int64_t> dims_from(int64_t first, int64_t ndim) {
  std::vector<int64_t> dims;
  for (int64_t d = first; d < ndim; ++d) dims.push_back(d);
  return dims;
}

// native_layer_norm(input, normalized_shape, weight?, bias?, eps) -> (out, mean, rstd)
LocalKernel layer_norm_forward(KernelMoves reduce, LayerNormGeometry g) {
  return [=](const c10::OperatorHandle& op, torch::jit::Stack* stack) {
    const OpArguments args(op, stack);
    const at::Tensor x = args.tensor("input");
    const c10::optional<at::Tensor> weight = args.optional_tensor("weight"), bias = args.optional_tensor("bias");
    const std::vector<int64_t> row = dims_from(g.axis, x.dim());
    const at::Tensor xd = x.to(at::kDouble);
    const at::Tensor sums = at::stack({xd.sum(row, true), xd.square().sum(row, true)}).contiguous();
    reduce.all_reduce(sums);
    const at::Tensor mean = sums[0] / g.count;
    const at::Tensor rstd = ((sums[1] / g.count - mean.square()).clamp_min(0) + args.to_double("eps")).rsqrt();
    at::Tensor out = ((xd - mean) * rstd).to(x.scalar_type());
    if (weight && weight->defined()) out.mul_(*weight);
    if (bias && bias->defined()) out.add_(*bias);
    stack->push_back(out);
    stack->push_back(mean.to(x.scalar_type()));
    stack->push_back(rstd.to(x.scalar_type()));
  };
}

// native_layer_norm_backward(grad_out, input, normalized_shape, mean, rstd, weight?, bias?, output_mask)
LocalKernel layer_norm_backward(KernelMoves reduce, LayerNormGeometry g) {
  return [=](const c10::OperatorHandle& op, torch::jit::Stack* stack) {
    const OpArguments args(op, stack);
    const at::Tensor grad = args.tensor("grad_out"), x = args.tensor("input");
    const c10::optional<at::Tensor> weight = args.optional_tensor("weight");
    const c10::List<bool> mask = args.bool_list("output_mask");
    const std::vector<int64_t> row = dims_from(g.axis, x.dim()), rows = dims_from(0, g.axis);
    const at::Tensor gd = grad.to(at::kDouble);
    const at::Tensor normalised = (x.to(at::kDouble) - args.tensor("mean").to(at::kDouble)) * args.tensor("rstd").to(at::kDouble);
    const at::Tensor gw = weight && weight->defined() ? gd * weight->to(at::kDouble) : gd;
    const at::Tensor sums = at::stack({gw.sum(row, true), (gw * normalised).sum(row, true)}).contiguous();
    reduce.all_reduce(sums);
    at::Tensor grad_input;
    if (mask.get(0))
      grad_input = (args.tensor("rstd").to(at::kDouble) * (gw - sums[0] / g.count - normalised * sums[1] / g.count)).to(x.scalar_type());
    auto over_rows = [&](const at::Tensor& t) { return rows.empty() ? t : t.sum(rows); };
    stack->push_back(grad_input);
    stack->push_back(mask.get(1) ? over_rows(gd * normalised).to(x.scalar_type()) : at::Tensor());
    stack->push_back(mask.get(2) ? over_rows(gd).to(x.scalar_type()) : at::Tensor());
  };
}

}  // namespace

LocalKernel LayerNormPlan::lower(const KernelMoves& moves) const {
  // `moves`: the row statistics' sums over the split rows.
  return pass == Pass::Forward ? layer_norm_forward(moves, geometry) : layer_norm_backward(moves, geometry);
}

}  // namespace shardtensor
