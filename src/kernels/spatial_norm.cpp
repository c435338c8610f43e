// Batch norm and group norm over sharded dims: the kernels of SpatialNormPlan
// (rules/spatial_norm.h; the rule file says how each layout is handled).
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include "domain/kernel_moves.h"
#include "kernels/stack.h"
#include "rules/spatial_norm.h"

namespace shardtensor {
namespace {

// Broadcasts a per-channel vector against [N, C, *].
at::Tensor per_channel(const at::Tensor& v, int64_t ndim) {
  std::vector<int64_t> shape(ndim, 1);
  shape[1] = v.numel();
  return v.view(shape);
}

// native_batch_norm(input, weight?, bias?, running_mean?, running_var?, training, momentum, eps)
LocalKernel batch_norm_forward(const KernelMoves& reduce, int64_t count) {
  return [=](const c10::OperatorHandle& op, torch::jit::Stack* stack) {
    const OpArguments args(op, stack);
    const at::Tensor x = args.tensor("input");
    const c10::optional<at::Tensor> weight = args.optional_tensor("weight"), bias = args.optional_tensor("bias");
    // _native_batch_norm_legit.no_stats has no running statistics.
    const bool stats = args.has("running_mean");
    const c10::optional<at::Tensor> running_mean = stats ? args.optional_tensor("running_mean") : c10::nullopt;
    const c10::optional<at::Tensor> running_var = stats ? args.optional_tensor("running_var") : c10::nullopt;
    const double momentum = args.to_double("momentum"), eps = args.to_double("eps");
    const std::vector<int64_t> dims = all_but_channel(x.dim());
    const at::Tensor xd = x.to(at::kDouble);
    const at::Tensor sums = at::stack({xd.sum(dims), xd.square().sum(dims)}).contiguous();
    reduce.all_reduce(sums);
    const at::Tensor mean = sums[0] / count;
    const at::Tensor var = (sums[1] / count - mean.square()).clamp_min(0);
    const at::Tensor invstd = (var + eps).rsqrt();
    at::Tensor out = ((xd - per_channel(mean, x.dim())) * per_channel(invstd, x.dim())).to(x.scalar_type());
    if (weight && weight->defined()) out.mul_(per_channel(*weight, x.dim()));
    if (bias && bias->defined()) out.add_(per_channel(*bias, x.dim()));
    at::NoGradGuard no_grad;
    if (running_mean && running_mean->defined()) running_mean->mul_(1 - momentum).add_(mean.to(running_mean->scalar_type()), momentum);
    if (running_var && running_var->defined())
      running_var->mul_(1 - momentum).add_((var * (static_cast<double>(count) / std::max<int64_t>(count - 1, 1))).to(running_var->scalar_type()), momentum);
    const size_t returns = op.schema().returns().size();
    stack->push_back(out);
    stack->push_back(mean.to(x.scalar_type()));
    stack->push_back(invstd.to(x.scalar_type()));
    // _batch_norm_with_update's reserve space, which only cuDNN's backward reads: empty, as on CPU.
    if (returns == 4) stack->push_back(at::empty({0}, x.options().dtype(at::kByte)));
  };
}

// native_batch_norm_backward(grad_out, input, weight?, running_mean?, running_var?, save_mean?,
// save_invstd?, train, eps, output_mask)
LocalKernel batch_norm_backward(const KernelMoves& reduce, int64_t count) {
  return [=](const c10::OperatorHandle& op, torch::jit::Stack* stack) {
    const OpArguments args(op, stack);
    const at::Tensor grad = args.tensor("grad_out"), x = args.tensor("input");
    const c10::optional<at::Tensor> weight = args.optional_tensor("weight");
    // batch_norm_backward names the saved inverse deviation save_var (what _batch_norm_with_update saved).
    const char* invstd_name = args.has("save_invstd") ? "save_invstd" : "save_var";
    const at::Tensor mean = args.tensor("save_mean").to(at::kDouble), invstd = args.tensor(invstd_name).to(at::kDouble);
    const c10::List<bool> mask = args.bool_list("output_mask");
    const std::vector<int64_t> dims = all_but_channel(x.dim());
    const at::Tensor gd = grad.to(at::kDouble), centred = x.to(at::kDouble) - per_channel(mean, x.dim());
    const at::Tensor sums = at::stack({gd.sum(dims), (gd * centred).sum(dims)}).contiguous();
    reduce.all_reduce(sums);
    const at::Tensor sum_dy = sums[0], sum_dy_xmu = sums[1];
    at::Tensor grad_input;
    if (mask.get(0)) {
      const at::Tensor k = per_channel(sum_dy_xmu * invstd.square() / count, x.dim());
      at::Tensor scale = invstd;
      if (weight && weight->defined()) scale = scale * weight->to(at::kDouble);
      grad_input = ((gd - per_channel(sum_dy / count, x.dim()) - centred * k) * per_channel(scale, x.dim())).to(x.scalar_type());
    }
    stack->push_back(grad_input);
    stack->push_back(mask.get(1) ? (sum_dy_xmu * invstd).to(x.scalar_type()) : at::Tensor());
    stack->push_back(mask.get(2) ? sum_dy.to(x.scalar_type()) : at::Tensor());
  };
}

// Group norm's N argument must be this rank's batch size.
void set_local_batch(OpArguments& args, const at::Tensor& x) { args.set("N", x.size(0)); }

// native_group_norm(input, weight?, bias?, N, C, HxW, group, eps)
LocalKernel group_norm_forward(const KernelMoves& reduce, int64_t hxw) {
  return [=](const c10::OperatorHandle& op, torch::jit::Stack* stack) {
    OpArguments args(op, stack);
    const at::Tensor x = args.tensor("input");
    set_local_batch(args, x);
    if (!reduce.reduces()) {  // no split spatial dim (of more than one rank): the op itself
      std::move(args).call(op, stack);
      return;
    }
    const c10::optional<at::Tensor> weight = args.optional_tensor("weight"), bias = args.optional_tensor("bias");
    const int64_t n = x.size(0), groups = args.to_int("group");
    const double eps = args.to_double("eps");
    const int64_t count = x.size(1) / groups * hxw;
    const at::Tensor xg = x.to(at::kDouble).reshape({n, groups, -1});
    const at::Tensor sums = at::stack({xg.sum(-1), xg.square().sum(-1)}).contiguous();
    reduce.all_reduce(sums);
    const at::Tensor mean = sums[0] / count;
    const at::Tensor rstd = ((sums[1] / count - mean.square()).clamp_min(0) + eps).rsqrt();
    at::Tensor out = ((xg - mean.unsqueeze(-1)) * rstd.unsqueeze(-1)).view(x.sizes()).to(x.scalar_type());
    if (weight && weight->defined()) out.mul_(per_channel(*weight, x.dim()));
    if (bias && bias->defined()) out.add_(per_channel(*bias, x.dim()));
    stack->push_back(out);
    stack->push_back(mean.to(x.scalar_type()));
    stack->push_back(rstd.to(x.scalar_type()));
  };
}

// native_group_norm_backward(grad_out, input, mean, rstd, weight?, N, C, HxW, group, output_mask)
LocalKernel group_norm_backward(const KernelMoves& reduce, int64_t hxw) {
  return [=](const c10::OperatorHandle& op, torch::jit::Stack* stack) {
    OpArguments args(op, stack);
    const at::Tensor grad = args.tensor("grad_out"), x = args.tensor("input");
    set_local_batch(args, x);
    if (!reduce.reduces()) {  // no split spatial dim (of more than one rank): the op itself
      std::move(args).call(op, stack);
      return;
    }
    const c10::optional<at::Tensor> weight = args.optional_tensor("weight");
    const int64_t n = x.size(0), channels = x.size(1), groups = args.to_int("group");
    const c10::List<bool> mask = args.bool_list("output_mask");
    const int64_t count = channels / groups * hxw;
    const at::Tensor mean = args.tensor("mean").to(at::kDouble).unsqueeze(-1), rstd = args.tensor("rstd").to(at::kDouble).unsqueeze(-1);
    const at::Tensor gd = grad.to(at::kDouble);
    const at::Tensor dyw = (weight && weight->defined() ? gd * per_channel(weight->to(at::kDouble), x.dim()) : gd).reshape({n, groups, -1});
    const at::Tensor centred = x.to(at::kDouble).reshape({n, groups, -1}) - mean;
    const at::Tensor sums = at::stack({(dyw * centred).sum(-1), dyw.sum(-1)}).contiguous();
    reduce.all_reduce(sums);
    const at::Tensor sum_dyw_xmu = sums[0].unsqueeze(-1), sum_dyw = sums[1].unsqueeze(-1);
    const at::Tensor normalised = (centred * rstd).view(x.sizes());
    at::Tensor grad_input;
    if (mask.get(0))
      grad_input = (rstd * (dyw - sum_dyw / count - centred * rstd.square() * sum_dyw_xmu / count)).view(x.sizes()).to(x.scalar_type());
    const std::vector<int64_t> dims = all_but_channel(x.dim());
    stack->push_back(grad_input);
    stack->push_back(mask.get(1) ? (gd * normalised).sum(dims).to(x.scalar_type()) : at::Tensor());
    stack->push_back(mask.get(2) ? gd.sum(dims).to(x.scalar_type()) : at::Tensor());
  };
}

}  // namespace

LocalKernel SpatialNormPlan::lower(const KernelMoves& moves) const {
  // `moves`: the statistics' sums over the split dims.
  if (norm == Norm::Batch) return backward ? batch_norm_backward(moves, count) : batch_norm_forward(moves, count);
  return backward ? group_norm_backward(moves, count) : group_norm_forward(moves, count);
}

}  // namespace shardtensor
