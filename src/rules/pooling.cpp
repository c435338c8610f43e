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
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <limits>

#include "rules/spatial.h"

namespace shardtensor {
namespace {

enum class PoolKind { Max, Avg, AdaptiveAvg };

struct PoolPlan {
  PoolPlan(PoolKind k, DeviceMesh mesh) : kind(k), axes{std::move(mesh), {}} {}

  PoolKind kind;
  int64_t spatial = 0;
  std::vector<int64_t> kernel, stride, dilation, global_lengths;
  std::vector<std::vector<Range>> outputs;    // per spatial dim, per rank
  at::Tensor divisor;                         // Avg: libtorch's divisor at each of this rank's outputs (double)
  WindowedAxes axes;                          // one per spatial dim for Max/Avg; sharded dims for AdaptiveAvg

  int64_t my_outputs(size_t k) const { return outputs[k][axes.axes[k].me(axes.mesh)].size(); }
  // `t` (shaped like this rank's outputs) divided by the divisor, in t's dtype and device.
  at::Tensor divided(const at::Tensor& t) const { return (t / divisor.to(t.device())).to(t.scalar_type()); }
};

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
PoolPlan sliding_pool_plan(const OpMeta& op, PoolKind kind, const ShardTensorSpec& in, size_t kernel_arg, OutputLayout* out) {
  PoolPlan plan(kind, in.mesh());
  plan.spatial = static_cast<int64_t>(int_list_arg(op, kernel_arg).size());
  plan.kernel = expand_param(op, kernel_arg, plan.spatial, {});
  plan.stride = expand_param(op, kernel_arg + 1, plan.spatial, plan.kernel);
  const std::vector<int64_t> padding = expand_param(op, kernel_arg + 2, plan.spatial, {0});
  const bool is_max = kind == PoolKind::Max;
  plan.dilation = is_max ? expand_param(op, kernel_arg + 3, plan.spatial, {1}) : std::vector<int64_t>(plan.spatial, 1);
  const bool ceil_mode = bool_arg(op, kernel_arg + (is_max ? 4 : 3));
  const bool count_include_pad = !is_max && bool_arg(op, kernel_arg + 4, true);
  c10::optional<int64_t> divisor_override;
  if (!is_max && !op.args[kernel_arg + 5].isNone()) divisor_override = op.args[kernel_arg + 5].toInt();
  std::vector<at::Tensor> factors;
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
    plan.axes.axes.push_back(std::move(axis));
    plan.global_lengths.push_back(length);
    if (!is_max) {  // this rank's factor of the divisor along this dim, shaped to broadcast
      const std::vector<double> all = avg_divisors(length, plan.kernel[i], padding[i], plan.stride[i], out_length, count_include_pad);
      const Range mine = plan.outputs.back()[plan.axes.axes.back().me(in.mesh())];
      std::vector<int64_t> shape(in.ndim(), 1);
      shape[d] = mine.size();
      factors.push_back(at::tensor(std::vector<double>(all.begin() + mine.begin, all.begin() + mine.end),
                                   at::TensorOptions().dtype(at::kDouble).device(in.mesh().device()))
                            .view(shape));
    }
  }
  if (!is_max) {
    plan.divisor = at::ones({}, at::kDouble);
    if (divisor_override) plan.divisor.fill_(static_cast<double>(*divisor_override));
    else for (const at::Tensor& f : factors) plan.divisor = plan.divisor * f;
  }
  return plan;
}

// Adaptive average pooling: a sharded dim whose length is a multiple of the output length is
// an average pool with kernel = stride = length / output; other sharded dims are gathered.
PoolPlan adaptive_plan(const ShardTensorSpec& in, const std::vector<int64_t>& out_sizes, OutputLayout* out) {
  PoolPlan plan(PoolKind::AdaptiveAvg, in.mesh());
  plan.spatial = static_cast<int64_t>(out_sizes.size());
  for (int64_t d : sharded_spatial_dims(in, plan.spatial)) {
    const int64_t o = out_sizes[d - (in.ndim() - plan.spatial)], factor = in.shape()[d] / o;
    const SlidingWindow w{factor, factor, 0, o};
    HaloAxis axis = sliding_axis(in, d, w);
    plan.outputs.push_back(sliding_outputs(axis.owned, w));
    *out = with_output_sizes(*out, d, plan.outputs.back());
    plan.axes.axes.push_back(std::move(axis));
  }
  return plan;
}

std::vector<int64_t> zero_list(int64_t n) { return std::vector<int64_t>(n, 0); }

// Shape of this rank's pooled output (for ranks with nothing to pool).
std::vector<int64_t> my_output_shape(const PoolPlan& plan, std::vector<int64_t> shape) {
  for (size_t k = 0; k < plan.axes.axes.size(); ++k) shape[plan.axes.axes[k].tensor_dim] = plan.my_outputs(k);
  return shape;
}

// Flat index over the spatial dims: window-local <-> global.
at::Tensor window_to_global(const PoolPlan& plan, at::Tensor idx, const at::Tensor& window) {
  at::Tensor global = at::zeros_like(idx);
  for (int64_t k = plan.spatial - 1, inner = 1; k >= 0; --k) {
    const HaloAxis& a = plan.axes.axes[k];
    const int64_t w = window.size(a.tensor_dim);
    const at::Tensor coord = idx.remainder(w) + a.window[a.me(plan.axes.mesh)].begin;
    idx = idx.div(w, "floor");
    global.add_(coord * inner);
    inner *= plan.global_lengths[k];
  }
  return global;
}

at::Tensor global_to_window(const PoolPlan& plan, at::Tensor idx, const std::vector<int64_t>& window_shape) {
  at::Tensor local = at::zeros_like(idx);
  for (int64_t k = plan.spatial - 1, inner = 1; k >= 0; --k) {
    const HaloAxis& a = plan.axes.axes[k];
    const at::Tensor coord = idx.remainder(plan.global_lengths[k]) - a.window[a.me(plan.axes.mesh)].begin;
    idx = idx.div(plan.global_lengths[k], "floor");
    local.add_(coord * inner);
    inner *= window_shape[a.tensor_dim];
  }
  return local;
}

// Runs a pooling op on this rank's window: gathers it (filled with `fill` outside the field),
// lets `adjust` rewrite the arguments for it, runs the op and `finish`es its outputs. A rank
// with nothing to pool returns zeros of its (empty) output shape, indices as long.
template <typename Adjust, typename Finish>
void forward_on_window(const PoolPlan& plan, const c10::OperatorHandle& op, torch::jit::Stack* stack, double fill,
                       Adjust adjust, Finish finish) {
  std::vector<c10::IValue> args = pop_arguments(op, stack);
  const at::Tensor window = plan.axes.gather(args[0].toTensor(), fill);
  if (window.numel() == 0) {
    const std::vector<int64_t> shape = my_output_shape(plan, window.sizes().vec());
    for (size_t k = 0; k < op.schema().returns().size(); ++k)
      stack->push_back(at::zeros(shape, window.options().dtype(k == 0 ? window.scalar_type() : at::kLong)));
    return;
  }
  args[0] = window;
  adjust(args, window);
  for (c10::IValue& a : args) stack->push_back(std::move(a));
  op.callBoxed(stack);
  finish(stack, window);
}

// Runs a pooling backward on this rank's window, then scatters the window gradient to the
// ranks that own it. The op reads only self's shape, so an empty tensor of the window's shape
// stands in for it (no input halo moves); `adjust` rewrites the other arguments.
template <typename Adjust>
void backward_on_window(const PoolPlan& plan, const c10::OperatorHandle& op, torch::jit::Stack* stack, Adjust adjust) {
  std::vector<c10::IValue> args = pop_arguments(op, stack);
  const at::Tensor self = args[1].toTensor();
  const std::vector<int64_t> window_shape = plan.axes.window_shape(self.sizes().vec());
  at::Tensor grad_window = at::zeros(window_shape, self.options());
  if (args[0].toTensor().numel() > 0) {
    args[1] = at::empty(window_shape, self.options());
    adjust(args, window_shape);
    for (c10::IValue& a : args) stack->push_back(std::move(a));
    op.callBoxed(stack);
    grad_window = stack->back().toTensor();
    stack->pop_back();
  }
  stack->push_back(plan.axes.scatter_add(grad_window));
}

using Args = std::vector<c10::IValue>;

// max_poolNd_with_indices(self, kernel, stride, padding, dilation, ceil_mode) -> (out, indices)
LocalKernel max_pool_forward(PoolPlan plan) {
  return [plan](const c10::OperatorHandle& op, torch::jit::Stack* stack) {
    forward_on_window(
        plan, op, stack, -std::numeric_limits<double>::infinity(),
        [&](Args& args, const at::Tensor&) {
          args[3] = zero_list(plan.spatial);  // padding: in the window already
          args[5] = false;                    // ceil_mode: likewise
        },
        [&](torch::jit::Stack* out, const at::Tensor& window) { out->back() = window_to_global(plan, out->back().toTensor(), window); });
  };
}

// max_poolNd_with_indices_backward(grad_output, self, kernel, stride, padding, dilation, ceil_mode, indices)
LocalKernel max_pool_backward(PoolPlan plan) {
  return [plan](const c10::OperatorHandle& op, torch::jit::Stack* stack) {
    backward_on_window(plan, op, stack, [&](Args& args, const std::vector<int64_t>& window_shape) {
      args[4] = zero_list(plan.spatial);
      args[6] = false;
      args[7] = global_to_window(plan, args[7].toTensor(), window_shape);
    });
  };
}

// avg_poolNd(self, kernel, stride, padding, ceil_mode, count_include_pad, divisor_override):
// the window sum (divisor 1), divided by libtorch's divisor for each output.
LocalKernel avg_pool_forward(PoolPlan plan) {
  return [plan](const c10::OperatorHandle& op, torch::jit::Stack* stack) {
    forward_on_window(
        plan, op, stack, 0.0,
        [&](Args& args, const at::Tensor&) {
          args[3] = zero_list(plan.spatial);
          args[4] = false;
          args[5] = true;
          args[6] = int64_t{1};
        },
        [&](torch::jit::Stack* out, const at::Tensor&) { out->back() = plan.divided(out->back().toTensor()); });
  };
}

// avg_poolNd_backward(grad_output, self, kernel, stride, padding, ceil_mode, count_include_pad, divisor_override)
LocalKernel avg_pool_backward(PoolPlan plan) {
  return [plan](const c10::OperatorHandle& op, torch::jit::Stack* stack) {
    backward_on_window(plan, op, stack, [&](Args& args, const std::vector<int64_t>&) {
      args[0] = plan.divided(args[0].toTensor());
      args[4] = zero_list(plan.spatial);
      args[5] = false;
      args[6] = true;
      args[7] = int64_t{1};
    });
  };
}

// _adaptive_avg_poolNd(self, output_size): the local op on the window, sharded dims' output
// sizes made local.
LocalKernel adaptive_forward(PoolPlan plan) {
  return [plan](const c10::OperatorHandle& op, torch::jit::Stack* stack) {
    forward_on_window(
        plan, op, stack, 0.0,
        [&](Args& args, const at::Tensor& window) {
          std::vector<int64_t> out_size = args[1].toIntVector();
          for (size_t k = 0; k < plan.axes.axes.size(); ++k)
            out_size[plan.axes.axes[k].tensor_dim - (window.dim() - plan.spatial)] = plan.my_outputs(k);
          args[1] = out_size;
        },
        [](torch::jit::Stack*, const at::Tensor&) {});
  };
}

// _adaptive_avg_poolNd_backward(grad_output, self)
LocalKernel adaptive_backward(PoolPlan plan) {
  return [plan](const c10::OperatorHandle& op, torch::jit::Stack* stack) {
    backward_on_window(plan, op, stack, [](Args&, const std::vector<int64_t>&) {});
  };
}

// The pooling ops' own dimensionality (the 1-D forms decompose into the 2-D ones).
int64_t spatial_count(const OpMeta& op) { return op.name.find("3d") != std::string::npos ? 3 : 2; }

// Forward and backward rules of a sliding pool; `self_arg` is where the pooled input sits,
// `kernel_arg` its kernel_size argument.
template <PoolKind Kind>
RuleResult sliding_pool_rule(const OpMeta& op, size_t self_arg, size_t kernel_arg, bool backward) {
  const ShardTensorSpec in = spatial_layout(op.input_at(self_arg)->spec, spatial_count(op), /*channel_whole=*/false);
  OutputLayout out = layout_of(in);
  const bool sharded = !sharded_spatial_dims(in, spatial_count(op)).empty();
  RuleResult r;
  if (!sharded) {
    for (const TensorInput& input : op.inputs) r.input_targets.push_back(align_to(input.spec, in));
    r.outputs = backward ? std::vector<OutputLayout>{layout_of(in)} : std::vector<OutputLayout>{layout_of(in), layout_of(in)};
    if (Kind == PoolKind::Avg && !backward) r.outputs.pop_back();
    r.local_kernel = empty_safe();
    return r;
  }
  const PoolPlan plan = sliding_pool_plan(op, Kind, in, kernel_arg, &out);
  for (const TensorInput& input : op.inputs)
    r.input_targets.push_back(input.arg_index == self_arg ? in : laid_out(input.spec, out));  // grad, indices
  if (!backward) {
    r.outputs = {out};
    if (Kind == PoolKind::Max) r.outputs.push_back(out);
    r.local_kernel = Kind == PoolKind::Max ? max_pool_forward(plan) : avg_pool_forward(plan);
  } else {
    r.outputs = {layout_of(in)};
    r.local_kernel = Kind == PoolKind::Max ? max_pool_backward(plan) : avg_pool_backward(plan);
  }
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
  const std::vector<int64_t> out_sizes = int_list_arg(op, 1);
  const ShardTensorSpec in = adaptive_layout(op.inputs[0].spec, out_sizes);
  OutputLayout out = layout_of(in);
  const PoolPlan plan = adaptive_plan(in, out_sizes, &out);
  RuleResult r;
  r.input_targets = {in};
  r.outputs = {out};
  r.local_kernel = plan.axes.axes.empty() ? empty_safe() : adaptive_forward(plan);
  return r;
}

RuleResult adaptive_backward_rule(const OpMeta& op) {
  const ShardTensorSpec& grad = op.inputs[0].spec;
  const int64_t k = spatial_count(op);
  const std::vector<int64_t> out_sizes(grad.shape().end() - k, grad.shape().end());
  const ShardTensorSpec in = adaptive_layout(op.inputs[1].spec, out_sizes);
  OutputLayout out = layout_of(in);
  const PoolPlan plan = adaptive_plan(in, out_sizes, &out);
  RuleResult r;
  r.input_targets = {laid_out(grad, out), in};
  r.outputs = {layout_of(in)};
  r.local_kernel = plan.axes.axes.empty() ? empty_safe() : adaptive_backward(plan);
  return r;
}

}  // namespace

void register_pooling_rules(RuleRegistry& registry) {
  for (const char* name : {"aten::max_pool2d_with_indices", "aten::max_pool3d_with_indices"})
    registry.add(name, [](const OpMeta& op) { return sliding_pool_rule<PoolKind::Max>(op, 0, 1, false); });
  for (const char* name : {"aten::max_pool2d_with_indices_backward", "aten::max_pool3d_with_indices_backward"})
    registry.add(name, [](const OpMeta& op) { return sliding_pool_rule<PoolKind::Max>(op, 1, 2, true); });
  for (const char* name : {"aten::avg_pool2d", "aten::avg_pool3d"})
    registry.add(name, [](const OpMeta& op) { return sliding_pool_rule<PoolKind::Avg>(op, 0, 1, false); });
  for (const char* name : {"aten::avg_pool2d_backward", "aten::avg_pool3d_backward"})
    registry.add(name, [](const OpMeta& op) { return sliding_pool_rule<PoolKind::Avg>(op, 1, 2, true); });
  for (const char* name : {"aten::_adaptive_avg_pool2d", "aten::_adaptive_avg_pool3d"}) registry.add(name, adaptive_rule);
  for (const char* name : {"aten::_adaptive_avg_pool2d_backward", "aten::_adaptive_avg_pool3d_backward"})
    registry.add(name, adaptive_backward_rule);
}

}  // namespace shardtensor
