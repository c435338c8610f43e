// Batch norm and group norm over sharded batch and spatial dims, forward and backward
// (instance norm decomposes into batch norm on a [1, N*C, ...] view).
//
// The statistics are sums over dims that are split across ranks: each rank sums its piece
// (in double), one all-reduce per sharding mesh dim of the stacked [sum, sum of squares]
// completes them, and the normalisation itself is local. Counts are global, from the spec.
// The backward needs two more sums (of dy and of dy * (x - mean)), again one all-reduce.
// Batch norm's weight and bias gradients come out of those complete sums (Replicate); group
// norm's are per-channel sums over rows, Partial(sum) over the sharding mesh dims.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include "comm/mesh_collectives.h"
#include "rules/spatial.h"

namespace shardtensor {
namespace {

std::vector<int64_t> all_but_channel(int64_t ndim) {
  std::vector<int64_t> dims = {0};
  for (int64_t d = 2; d < ndim; ++d) dims.push_back(d);
  return dims;
}

// Broadcasts a per-channel vector against [N, C, *].
at::Tensor per_channel(const at::Tensor& v, int64_t ndim) {
  std::vector<int64_t> shape(ndim, 1);
  shape[1] = v.numel();
  return v.view(shape);
}

int64_t global_count(const ShardTensorSpec& spec, const std::vector<int64_t>& dims) {
  int64_t n = 1;
  for (int64_t d : dims) n *= spec.shape()[d];
  return n;
}

// ---- batch norm ----

// native_batch_norm(input, weight?, bias?, running_mean?, running_var?, training, momentum, eps)
LocalKernel batch_norm_forward(DeviceMesh mesh, std::vector<int64_t> mesh_dims, int64_t count) {
  return [=](const c10::OperatorHandle& op, torch::jit::Stack* stack) {
    const std::vector<c10::IValue> args = pop_arguments(op, stack);
    const at::Tensor x = args[0].toTensor();
    const c10::optional<at::Tensor> weight = args[1].toOptional<at::Tensor>(), bias = args[2].toOptional<at::Tensor>();
    const c10::optional<at::Tensor> running_mean = args[3].toOptional<at::Tensor>(), running_var = args[4].toOptional<at::Tensor>();
    const double momentum = args[6].toDouble(), eps = args[7].toDouble();
    const std::vector<int64_t> dims = all_but_channel(x.dim());
    const at::Tensor xd = x.to(at::kDouble);
    const at::Tensor sums = at::stack({xd.sum(dims), xd.square().sum(dims)}).contiguous();
    all_reduce_over(mesh, mesh_dims, sums, ReduceOp::Sum);
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
    stack->push_back(out);
    stack->push_back(mean.to(x.scalar_type()));
    stack->push_back(invstd.to(x.scalar_type()));
  };
}

// native_batch_norm_backward(grad_out, input, weight?, running_mean?, running_var?, save_mean?,
// save_invstd?, train, eps, output_mask)
LocalKernel batch_norm_backward(DeviceMesh mesh, std::vector<int64_t> mesh_dims, int64_t count) {
  return [=](const c10::OperatorHandle& op, torch::jit::Stack* stack) {
    const std::vector<c10::IValue> args = pop_arguments(op, stack);
    const at::Tensor grad = args[0].toTensor(), x = args[1].toTensor();
    const c10::optional<at::Tensor> weight = args[2].toOptional<at::Tensor>();
    const at::Tensor mean = args[5].toTensor().to(at::kDouble), invstd = args[6].toTensor().to(at::kDouble);
    const c10::List<bool> mask = args[9].toBoolList();
    const std::vector<int64_t> dims = all_but_channel(x.dim());
    const at::Tensor gd = grad.to(at::kDouble), centred = x.to(at::kDouble) - per_channel(mean, x.dim());
    const at::Tensor sums = at::stack({gd.sum(dims), (gd * centred).sum(dims)}).contiguous();
    all_reduce_over(mesh, mesh_dims, sums, ReduceOp::Sum);
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

ShardTensorSpec channels_whole(const ShardTensorSpec& spec) { return spatial_layout(spec, spec.ndim() - 2, true); }

RuleResult batch_norm_rule(const OpMeta& op) {
  const ShardTensorSpec in = channels_whole(op.inputs[0].spec);
  if (bool_arg(op, 5))
    for (size_t arg : {3, 4})
      if (const TensorInput* stat = op.input_at(arg))
        TORCH_CHECK(stat->spec.is_replicated(), op.name, ": the running ", arg == 3 ? "mean" : "variance",
                    " is updated in place, so it must be replicated (a Replicate ShardTensor, or a plain tensor inside an "
                    "ImplicitReplication scope); got ", stat->spec);
  RuleResult r;
  r.input_targets = {in};
  for (size_t k = 1; k < op.inputs.size(); ++k) r.input_targets.push_back(replicated(op.inputs[k].spec));
  const OutputLayout whole = replicated_layout(in.mesh());
  r.outputs = {layout_of(in), whole, whole};
  const std::vector<int64_t> mesh_dims = sharding_mesh_dims(in);
  if (bool_arg(op, 5) && !mesh_dims.empty())
    r.local_kernel = batch_norm_forward(in.mesh(), mesh_dims, global_count(in, all_but_channel(in.ndim())));
  else
    r.local_kernel = empty_safe({}, {Follows::AllDims, Follows::Nothing, Follows::Nothing});
  return r;
}

RuleResult batch_norm_backward_rule(const OpMeta& op) {
  const ShardTensorSpec in = channels_whole(op.input_at(1)->spec);
  RuleResult r;
  for (const TensorInput& input : op.inputs)
    r.input_targets.push_back(input.arg_index == 1 ? in : input.arg_index == 0 ? align_to(input.spec, in) : replicated(input.spec));
  const std::vector<int64_t> mesh_dims = sharding_mesh_dims(in);
  if (bool_arg(op, 7) && !mesh_dims.empty()) {
    const OutputLayout whole = replicated_layout(in.mesh());
    r.outputs = {layout_of(in), whole, whole};
    r.local_kernel = batch_norm_backward(in.mesh(), mesh_dims, global_count(in, all_but_channel(in.ndim())));
  } else {  // evaluation statistics: the gradient is local, weight and bias gradients are sums over rows
    const OutputLayout summed{summed_over_shards(in), {}};
    r.outputs = {layout_of(in), summed, summed};
    r.local_kernel = empty_safe({}, {Follows::AllDims, Follows::Nothing, Follows::Nothing});
  }
  return r;
}

// ---- group norm ----

// mean and rstd are [N, G]: sharded like the input's batch dim, whole elsewhere.
OutputLayout stats_layout(const ShardTensorSpec& in) {
  OutputLayout layout{Placements(in.placements().size(), Replicate()), {}};
  for (size_t m = 0; m < in.placements().size(); ++m)
    if (in.placements()[m].is_shard(0)) layout.placements[m] = Shard(0);
  if (const DimSharding* s = in.sharding_of(0)) layout.sizes.push_back({0, s->sizes});
  return layout;
}

// Group norm's N argument (its index in the schema) must be this rank's batch size.
void set_local_batch(std::vector<c10::IValue>& args, size_t n_arg, const at::Tensor& x) { args[n_arg] = x.size(0); }

// native_group_norm(input, weight?, bias?, N, C, HxW, group, eps)
LocalKernel group_norm_forward(DeviceMesh mesh, std::vector<int64_t> spatial_mesh_dims, int64_t hxw) {
  return [=](const c10::OperatorHandle& op, torch::jit::Stack* stack) {
    std::vector<c10::IValue> args = pop_arguments(op, stack);
    const at::Tensor x = args[0].toTensor();
    set_local_batch(args, 3, x);
    if (spatial_mesh_dims.empty()) {
      for (c10::IValue& a : args) stack->push_back(std::move(a));
      op.callBoxed(stack);
      return;
    }
    const c10::optional<at::Tensor> weight = args[1].toOptional<at::Tensor>(), bias = args[2].toOptional<at::Tensor>();
    const int64_t n = x.size(0), groups = args[6].toInt();
    const double eps = args[7].toDouble();
    const int64_t count = x.size(1) / groups * hxw;
    const at::Tensor xg = x.to(at::kDouble).reshape({n, groups, -1});
    const at::Tensor sums = at::stack({xg.sum(-1), xg.square().sum(-1)}).contiguous();
    all_reduce_over(mesh, spatial_mesh_dims, sums, ReduceOp::Sum);
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
LocalKernel group_norm_backward(DeviceMesh mesh, std::vector<int64_t> spatial_mesh_dims, int64_t hxw) {
  return [=](const c10::OperatorHandle& op, torch::jit::Stack* stack) {
    std::vector<c10::IValue> args = pop_arguments(op, stack);
    const at::Tensor grad = args[0].toTensor(), x = args[1].toTensor();
    set_local_batch(args, 5, x);
    if (spatial_mesh_dims.empty()) {
      for (c10::IValue& a : args) stack->push_back(std::move(a));
      op.callBoxed(stack);
      return;
    }
    const c10::optional<at::Tensor> weight = args[4].toOptional<at::Tensor>();
    const int64_t n = x.size(0), channels = x.size(1), groups = args[8].toInt();
    const c10::List<bool> mask = args[9].toBoolList();
    const int64_t count = channels / groups * hxw;
    const at::Tensor mean = args[2].toTensor().to(at::kDouble).unsqueeze(-1), rstd = args[3].toTensor().to(at::kDouble).unsqueeze(-1);
    const at::Tensor gd = grad.to(at::kDouble);
    const at::Tensor dyw = (weight && weight->defined() ? gd * per_channel(weight->to(at::kDouble), x.dim()) : gd).reshape({n, groups, -1});
    const at::Tensor centred = x.to(at::kDouble).reshape({n, groups, -1}) - mean;
    const at::Tensor sums = at::stack({(dyw * centred).sum(-1), dyw.sum(-1)}).contiguous();
    all_reduce_over(mesh, spatial_mesh_dims, sums, ReduceOp::Sum);
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

std::vector<int64_t> spatial_mesh_dims_of(const ShardTensorSpec& in) {
  return sharding_mesh_dims(in, [](int64_t d) { return d >= 2; });
}

int64_t spatial_count_of(const ShardTensorSpec& in) { return global_count(in, [&] {
  std::vector<int64_t> dims;
  for (int64_t d = 2; d < in.ndim(); ++d) dims.push_back(d);
  return dims;
}()); }

RuleResult group_norm_rule(const OpMeta& op) {
  const ShardTensorSpec in = channels_whole(op.inputs[0].spec);
  RuleResult r;
  r.input_targets = {in};
  for (size_t k = 1; k < op.inputs.size(); ++k) r.input_targets.push_back(replicated(op.inputs[k].spec));
  r.outputs = {layout_of(in), stats_layout(in), stats_layout(in)};
  if (!in.shardings().empty()) r.local_kernel = empty_safe(group_norm_forward(in.mesh(), spatial_mesh_dims_of(in), spatial_count_of(in)),
                                                             {Follows::AllDims, Follows::BatchDim, Follows::BatchDim});
  return r;
}

RuleResult group_norm_backward_rule(const OpMeta& op) {
  const ShardTensorSpec in = channels_whole(op.input_at(1)->spec);
  const OutputLayout stats = stats_layout(in);
  RuleResult r;
  for (const TensorInput& input : op.inputs) {
    switch (input.arg_index) {
      case 0: r.input_targets.push_back(align_to(input.spec, in)); break;
      case 1: r.input_targets.push_back(in); break;
      case 2:
      case 3: r.input_targets.push_back(laid_out(input.spec, stats)); break;
      default: r.input_targets.push_back(replicated(input.spec));
    }
  }
  const OutputLayout summed{summed_over_shards(in), {}};
  r.outputs = {layout_of(in), summed, summed};
  if (!in.shardings().empty()) r.local_kernel = empty_safe(group_norm_backward(in.mesh(), spatial_mesh_dims_of(in), spatial_count_of(in)),
                                                             {Follows::AllDims, Follows::Nothing, Follows::Nothing});
  return r;
}

}  // namespace

void register_spatial_norm_rules(RuleRegistry& registry) {
  registry.add("aten::native_batch_norm", batch_norm_rule);
  registry.add("aten::native_batch_norm_backward", batch_norm_backward_rule);
  registry.add("aten::native_group_norm", group_norm_rule);
  registry.add("aten::native_group_norm_backward", group_norm_backward_rule);
}

}  // namespace shardtensor
