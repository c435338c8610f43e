// Pooling over sharded spatial dims: max pooling with indices, average pooling and adaptive
// average pooling (2-D and 3-D; the 1-D forms decompose into the 2-D ones), forward and
// backward.
//
// Pooling windows are sliding windows (spatial.h): a rank gathers the window its outputs
// read, filled with -inf (max) or 0 (average) outside the field, and pools it with no
// padding and no ceil mode, since the window already holds both. Average pooling sums the
// window (divisor 1) and divides by the divisor libtorch would use at each output position,
// computed from the global geometry, so count_include_pad, ceil_mode and divisor_override
// keep their meaning. Max-pooling indices are global (flat over the whole field), as on one
// device; the backward turns them back into window positions, so it needs no input data.
// Backward passes scatter the window gradients to the ranks that own them.
#include "rules/pooling.h"

#include <ATen/core/function_schema.h>

#include <limits>

namespace shardtensor {
namespace {

int64_t floor_div(int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }

// libtorch's pooling_output_shape.
int64_t pooled_length(int64_t length, int64_t kernel, int64_t pad, int64_t stride, int64_t dilation, bool ceil_mode) {
  int64_t out = floor_div(length + 2 * pad - dilation * (kernel - 1) - 1 + (ceil_mode ? stride - 1 : 0), stride) + 1;
  if (ceil_mode && (out - 1) * stride >= length + pad) --out;
  return out;
}

// libtorch's average-pooling divisor at every output position along one dim.
std::vector<double> avg_divisors(int64_t length, int64_t kernel, int64_t pad, int64_t stride, int64_t out_length,
                                 bool count_include_pad) {
  std::vector<double> divisors;
  for (int64_t o = 0; o < out_length; ++o) {
    const int64_t start = o * stride - pad, end = std::min(start + kernel, length + pad);
    const int64_t inside = std::min(end, length) - std::max<int64_t>(start, 0);
    divisors.push_back(static_cast<double>(count_include_pad ? end - start : inside));
  }
  return divisors;
}

// Max/Avg: every spatial dim becomes an axis (unsharded ones pad locally, no collective).
// Forward and backward name their arguments alike; only max pooling has a dilation, only
// average pooling count_include_pad and divisor_override.
PoolPlan sliding_pool_plan(const OpMeta& op, PoolKind kind, bool backward, const ShardTensorSpec& in, OutputLayout* out) {
  PoolPlan plan(kind, backward, in.mesh());
  plan.spatial = static_cast<int64_t>(int_list_arg(op, "kernel_size").size());
  plan.kernel = expand_param(op, "kernel_size", plan.spatial, {});
  plan.stride = expand_param(op, "stride", plan.spatial, plan.kernel);
  const std::vector<int64_t> padding = expand_param(op, "padding", plan.spatial, {0});
  const bool is_max = kind == PoolKind::Max;
  plan.dilation = is_max ? expand_param(op, "dilation", plan.spatial, {1}) : std::vector<int64_t>(plan.spatial, 1);
  const bool ceil_mode = bool_arg(op, "ceil_mode");
  const bool count_include_pad = !is_max && bool_arg(op, "count_include_pad", true);
  if (!is_max) plan.divisor_override = optional_int_arg(op, "divisor_override");
  const int64_t first = in.ndim() - plan.spatial;
  for (int64_t i = 0; i < plan.spatial; ++i) {
    const int64_t d = first + i, length = in.shape()[d];
    TORCH_CHECK(padding[i] * 2 <= plan.kernel[i], op.name, ": padding ", padding[i], " must be at most half the kernel size ",
                plan.kernel[i]);
    const int64_t out_length = pooled_length(length, plan.kernel[i], padding[i], plan.stride[i], plan.dilation[i], ceil_mode);
    TORCH_CHECK(out_length > 0, op.name, ": the output along dim ", d, " would be empty (input ", length, ", kernel ",
                plan.kernel[i], ")");
    const SlidingWindow w{plan.dilation[i] * (plan.kernel[i] - 1) + 1, plan.stride[i], padding[i], out_length};
    HaloAxis axis = sliding_axis(in, d, w);
    plan.outputs.push_back(sliding_outputs(axis.owned, w));
    if (axis.mesh_dim >= 0) *out = with_output_sizes(*out, d, plan.outputs.back());
    plan.halo.axes.push_back(std::move(axis));
    plan.global_lengths.push_back(length);
    if (!is_max)
      plan.divisor_factors.push_back(avg_divisors(length, plan.kernel[i], padding[i], plan.stride[i], out_length, count_include_pad));
  }
  return plan;
}

// Adaptive average pooling: a sharded dim whose length is a multiple of the output length is
// an average pool with kernel = stride = length / output; other sharded dims are gathered.
PoolPlan adaptive_plan(const ShardTensorSpec& in, const std::vector<int64_t>& out_sizes, bool backward, OutputLayout* out) {
  PoolPlan plan(PoolKind::AdaptiveAvg, backward, in.mesh());
  plan.spatial = static_cast<int64_t>(out_sizes.size());
  for (int64_t d : sharded_spatial_dims(in, plan.spatial)) {
    const int64_t o = out_sizes[d - (in.ndim() - plan.spatial)], factor = in.shape()[d] / o;
    const SlidingWindow w{factor, factor, 0, o};
    HaloAxis axis = sliding_axis(in, d, w);
    plan.outputs.push_back(sliding_outputs(axis.owned, w));
    *out = with_output_sizes(*out, d, plan.outputs.back());
    plan.halo.axes.push_back(std::move(axis));
  }
  return plan;
}

// The pooling ops' own dimensionality (the 1-D forms decompose into the 2-D ones).
int64_t spatial_count(const OpMeta& op) { return op.name.find("3d") != std::string::npos ? 3 : 2; }

// Forward and backward rules of a sliding pool; the pooled input is `self` in both.
template <PoolKind Kind>
RuleResult sliding_pool_rule(const OpMeta& op, bool backward) {
  const ShardTensorSpec in = spatial_layout(op.input_named("self")->spec, spatial_count(op), /*channel_whole=*/false);
  OutputLayout out = layout_of(in);
  const bool sharded = !sharded_spatial_dims(in, spatial_count(op)).empty();
  RuleResult r;
  if (!sharded) {
    for (const TensorInput& input : op.inputs) r.input_targets.push_back(align_to(input.spec, in));
    r.outputs = backward ? std::vector<OutputLayout>{layout_of(in)} : std::vector<OutputLayout>{layout_of(in), layout_of(in)};
    if (Kind == PoolKind::Avg && !backward) r.outputs.pop_back();
    r.kernel_plan = empty_safe();
    return r;
  }
  PoolPlan plan = sliding_pool_plan(op, Kind, backward, in, &out);
  for (const TensorInput& input : op.inputs)
    r.input_targets.push_back(arg_name(op, input) == "self" ? in : laid_out(input.spec, out));  // grad_output, indices
  if (!backward) {
    r.outputs = {out};
    if (Kind == PoolKind::Max) r.outputs.push_back(out);
  } else {
    r.outputs = {layout_of(in)};
  }
  r.kernel_plan = declare(std::move(plan));
  return r;
}

// Sharded dims that adaptive pooling cannot split evenly are gathered.
ShardTensorSpec adaptive_layout(const ShardTensorSpec& spec, const std::vector<int64_t>& out_sizes) {
  const int64_t k = static_cast<int64_t>(out_sizes.size());
  ShardTensorSpec in = spatial_layout(spec, k, false);
  std::vector<int64_t> uneven;
  for (int64_t d : sharded_spatial_dims(in, k)) {
    const int64_t o = out_sizes[d - (in.ndim() - k)];
    if (o <= 0 || in.shape()[d] % o != 0) uneven.push_back(d);
  }
  return replicate_tensor_dims(in, uneven);
}

RuleResult adaptive_rule(const OpMeta& op) {
  const std::vector<int64_t> out_sizes = int_list_arg(op, "output_size");
  const ShardTensorSpec in = adaptive_layout(op.inputs[0].spec, out_sizes);
  OutputLayout out = layout_of(in);
  PoolPlan plan = adaptive_plan(in, out_sizes, /*backward=*/false, &out);
  RuleResult r;
  r.input_targets = {in};
  r.outputs = {out};
  r.kernel_plan = plan.halo.axes.empty() ? empty_safe() : declare(std::move(plan));
  return r;
}

RuleResult adaptive_backward_rule(const OpMeta& op) {
  const ShardTensorSpec& grad = op.inputs[0].spec;
  const int64_t k = spatial_count(op);
  const std::vector<int64_t> out_sizes(grad.shape().end() - k, grad.shape().end());
  const ShardTensorSpec in = adaptive_layout(op.inputs[1].spec, out_sizes);
  OutputLayout out = layout_of(in);
  PoolPlan plan = adaptive_plan(in, out_sizes, /*backward=*/true, &out);
  RuleResult r;
  r.input_targets = {laid_out(grad, out), in};
  r.outputs = {layout_of(in)};
  r.kernel_plan = plan.halo.axes.empty() ? empty_safe() : declare(std::move(plan));
  return r;
}

// Pools whose windows are adaptive (max), random (fractional) or given by indices (unpooling):
// no halo geometry serves them, so the k spatial dims are read whole. The batch dim keeps its
// shards (libtorch takes an empty batch, not empty channels, so channels are read whole too),
// and the other tensor inputs (indices, random samples) follow self's batch. An unbatched input
// ([C, spatial...]) is read whole.
RuleResult spatial_whole_rule(const OpMeta& op, int64_t k) {
  const TensorInput& self = *op.input_named("self");
  const bool batched = self.spec.ndim() == k + 2;
  const ShardTensorSpec target = batched ? keep_leading_dims(self.spec, 1) : replicated(self.spec);
  RuleResult r;
  for (const TensorInput& in : op.inputs)
    r.input_targets.push_back(in.arg_index == self.arg_index ? target
                              : batched                       ? leading_like(in.spec, target, 1)
                                                              : replicated(in.spec));
  r.outputs.assign(op.schema->returns().size(), layout_of(target));
  return r;
}

}  // namespace

std::string PoolPlan::name() const {
  const char* what = kind == PoolKind::Max ? "max pooling" : kind == PoolKind::Avg ? "average pooling" : "adaptive average pooling";
  return std::string("halo ") + what + (backward ? " (backward)" : " (forward)");
}

std::vector<MoveStep> PoolPlan::moves() const { return backward ? halo_scatter_adds(halo) : halo_gathers(halo); }

// Max pooling's window holds -inf outside the field: no position there is ever the maximum.
MoveLowering PoolPlan::move_lowering() const {
  return {halo.mesh, halo.axes, kind == PoolKind::Max ? -std::numeric_limits<double>::infinity() : 0.0};
}

void register_pooling_rules(RuleRegistry& registry) {
  for (const char* name : {"aten::max_pool2d_with_indices", "aten::max_pool3d_with_indices"})
    registry.add(name, [](const OpMeta& op) { return sliding_pool_rule<PoolKind::Max>(op, /*backward=*/false); });
  for (const char* name : {"aten::max_pool2d_with_indices_backward", "aten::max_pool3d_with_indices_backward"})
    registry.add(name, [](const OpMeta& op) { return sliding_pool_rule<PoolKind::Max>(op, /*backward=*/true); });
  for (const char* name : {"aten::avg_pool2d", "aten::avg_pool3d"})
    registry.add(name, [](const OpMeta& op) { return sliding_pool_rule<PoolKind::Avg>(op, /*backward=*/false); });
  for (const char* name : {"aten::avg_pool2d_backward", "aten::avg_pool3d_backward"})
    registry.add(name, [](const OpMeta& op) { return sliding_pool_rule<PoolKind::Avg>(op, /*backward=*/true); });
  for (const char* name : {"aten::_adaptive_avg_pool2d", "aten::_adaptive_avg_pool3d"}) registry.add(name, adaptive_rule);
  for (const char* name : {"aten::_adaptive_avg_pool2d_backward", "aten::_adaptive_avg_pool3d_backward"})
    registry.add(name, adaptive_backward_rule);
  for (const char* name : {"aten::adaptive_max_pool2d", "aten::fractional_max_pool2d", "aten::max_unpool2d"})
    registry.add(name, [](const OpMeta& op) { return spatial_whole_rule(op, 2); });
  for (const char* name : {"aten::adaptive_max_pool3d", "aten::fractional_max_pool3d", "aten::max_unpool3d"})
    registry.add(name, [](const OpMeta& op) { return spatial_whole_rule(op, 3); });
}

}  // namespace shardtensor
