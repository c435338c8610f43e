// Convolution with halo exchange: aten::convolution and aten::convolution_backward, 1-D to
// 3-D, any kernel, stride, padding, dilation and groups, regular and transposed (conv1d/2d/3d
// and conv_transpose*d all reach these two operators).
//
// The input may be sharded on its batch dim and on any spatial dims (one mesh dim each, any
// shard sizes); channels are gathered; weight and bias are replicated. The output keeps the
// input's placements, with shard sizes derived from the input's (spatial.h).
//
// Regular convolution: each rank gathers the window its outputs read (gather_window: the
// neighbours' halo rows, zeros outside the field, any number of hops) and runs the local
// convolution with no padding on the sharded dims. Backward gathers the same window again,
// runs the local convolution_backward, and sends the input gradient's halo parts back to
// their owners, where they are added (scatter_add_window). Weight and bias gradients are
// Partial(sum) over every mesh dim that shards the input.
//
// Transposed convolution is the adjoint: each rank computes the full contribution of its
// own input rows (a window of the output reaching past its shard), and the overlaps are sent
// to their owners and added; the bias is added once by the owner. Its backward gathers the
// output gradient's window, which is a regular convolution.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include "rules/spatial.h"

namespace shardtensor {
namespace {

struct ConvParams {
  int64_t spatial = 0;
  std::vector<int64_t> kernel, stride, padding, dilation, output_padding;
  bool transposed = false;
  int64_t groups = 1;

  int64_t extent(int64_t i) const { return dilation[i] * (kernel[i] - 1) + 1; }
};

// `first` is the index of the stride argument (3 for convolution, 4 for its backward).
ConvParams conv_params(const OpMeta& op, size_t first, const ShardTensorSpec& weight) {
  ConvParams p;
  p.spatial = weight.ndim() - 2;
  for (int64_t i = 0; i < p.spatial; ++i) p.kernel.push_back(weight.shape()[2 + i]);
  p.stride = expand_param(op, first, p.spatial, {1});
  p.padding = expand_param(op, first + 1, p.spatial, {0});
  p.dilation = expand_param(op, first + 2, p.spatial, {1});
  p.transposed = bool_arg(op, first + 3);
  p.output_padding = expand_param(op, first + 4, p.spatial, {0});
  p.groups = int_arg(op, first + 5);
  return p;
}

// Along a sharded dim the output of a transposed convolution starts, for rank r, at a_r * s:
// the first position its own input rows reach. Its window is everything they reach.
HaloAxis transposed_axis(const ShardTensorSpec& in, int64_t tensor_dim, const ConvParams& p) {
  const int64_t i = tensor_dim - (in.ndim() - p.spatial), s = p.stride[i], pad = p.padding[i];
  const int64_t length = in.shape()[tensor_dim];
  HaloAxis axis;
  axis.tensor_dim = tensor_dim;
  axis.mesh_dim = sharding_mesh_dim(in, tensor_dim);
  axis.length = (length - 1) * s - 2 * pad + p.extent(i) + p.output_padding[i];
  const std::vector<Range> rows = owned_ranges(in, tensor_dim);
  for (size_t r = 0; r < rows.size(); ++r) {
    const int64_t begin = r == 0 ? 0 : std::min(std::max<int64_t>(rows[r].begin * s, 0), axis.length);
    axis.owned.push_back({begin, axis.length});
    if (r > 0) axis.owned[r - 1].end = begin;
    const int64_t first = rows[r].begin * s - pad;
    axis.window.push_back(rows[r].size() ? Range{first, (rows[r].end - 1) * s - pad + p.extent(i)} : Range{first, first});
  }
  return axis;
}

// Everything a local kernel needs: the halo axes and the parameters with the sharded dims'
// padding removed (the window carries it).
struct ConvPlan {
  ConvParams params;
  WindowedAxes axes;
  std::vector<std::vector<Range>> outputs;  // per axis: the output range of every rank
  std::vector<int64_t> local_padding, local_output_padding;

  bool empty_here(const at::Tensor& t) const {  // a sharded dim with no positions on this rank
    for (const HaloAxis& a : axes.axes)
      if (t.size(a.tensor_dim) == 0) return true;
    return false;
  }

  // The shape of the local op's result on `input` (a window, or the local rows when
  // transposed), for when there is nothing to compute: zeros of this shape stand in.
  std::vector<int64_t> local_result_shape(const at::Tensor& input, int64_t channels) const {
    std::vector<int64_t> shape = input.sizes().vec();
    shape[1] = channels;
    const int64_t first = input.dim() - params.spatial;
    for (int64_t i = 0; i < params.spatial; ++i) {
      const int64_t n = input.size(first + i), s = params.stride[i], e = params.extent(i);
      shape[first + i] = params.transposed ? (n - 1) * s - 2 * local_padding[i] + e + local_output_padding[i]
                                           : (n + 2 * local_padding[i] - e) / s + 1;
    }
    for (size_t k = 0; k < axes.axes.size(); ++k) {
      const HaloAxis& a = axes.axes[k];
      const int64_t me = a.me(axes.mesh);
      shape[a.tensor_dim] = params.transposed ? a.window[me].size() : outputs[k][me].size();
    }
    return shape;
  }
};

ConvPlan conv_plan(const ShardTensorSpec& in, const ConvParams& p, OutputLayout* out) {
  ConvPlan plan{p, {in.mesh(), {}}, {}, p.padding, p.output_padding};
  const int64_t first_spatial = in.ndim() - p.spatial;
  for (int64_t d : sharded_spatial_dims(in, p.spatial)) {
    const int64_t i = d - first_spatial;
    if (p.transposed) {
      HaloAxis axis = transposed_axis(in, d, p);
      *out = with_output_sizes(*out, d, axis.owned);
      plan.outputs.push_back(axis.owned);
      plan.axes.axes.push_back(std::move(axis));
    } else {
      const int64_t length = in.shape()[d];
      const SlidingWindow w{p.extent(i), p.stride[i], p.padding[i], (length + 2 * p.padding[i] - p.extent(i)) / p.stride[i] + 1};
      TORCH_CHECK(length + 2 * p.padding[i] >= p.extent(i), "convolution: the padded input (", length, " + 2 * ",
                  p.padding[i], ") along dim ", d, " is smaller than the kernel extent ", p.extent(i));
      HaloAxis axis = sliding_axis(in, d, w);
      plan.outputs.push_back(sliding_outputs(axis.owned, w));
      *out = with_output_sizes(*out, d, plan.outputs.back());
      plan.axes.axes.push_back(std::move(axis));
    }
    plan.local_padding[i] = 0;
    plan.local_output_padding[i] = 0;
  }
  return plan;
}

// Regular convolution on this rank's window.
LocalKernel regular_forward(ConvPlan plan) {
  return [plan](const c10::OperatorHandle& op, torch::jit::Stack* stack) {
    std::vector<c10::IValue> args = pop_arguments(op, stack);
    const at::Tensor window = plan.axes.gather(args[0].toTensor(), 0.0);
    const at::Tensor weight = args[1].toTensor();
    if (plan.empty_here(window)) {  // no outputs on this rank
      stack->push_back(at::zeros(plan.local_result_shape(window, weight.size(0)), window.options()));
      return;
    }
    args[0] = window;
    args[4] = plan.local_padding;
    for (c10::IValue& a : args) stack->push_back(std::move(a));
    op.callBoxed(stack);
  };
}

// convolution_backward for a regular convolution: the input window again, then its gradient
// scattered back to the owners.
LocalKernel regular_backward(ConvPlan plan) {
  return [plan](const c10::OperatorHandle& op, torch::jit::Stack* stack) {
    std::vector<c10::IValue> args = pop_arguments(op, stack);
    const at::Tensor grad = args[0].toTensor(), weight = args[2].toTensor();
    const at::Tensor window = plan.axes.gather(args[1].toTensor(), 0.0);
    const std::vector<bool> mask = {args[10].toBoolList().get(0), args[10].toBoolList().get(1), args[10].toBoolList().get(2)};
    at::Tensor grad_window, grad_weight, grad_bias;
    if (grad.numel() == 0 || window.numel() == 0) {
      grad_window = at::zeros_like(window);
      grad_weight = at::zeros_like(weight);
      grad_bias = at::zeros({weight.size(0)}, weight.options());
    } else {
      args[1] = window;
      args[5] = plan.local_padding;
      for (c10::IValue& a : args) stack->push_back(std::move(a));
      op.callBoxed(stack);
      grad_bias = stack->back().toTensor();
      stack->pop_back();
      grad_weight = stack->back().toTensor();
      stack->pop_back();
      grad_window = stack->back().toTensor();
      stack->pop_back();
    }
    stack->push_back(mask[0] ? plan.axes.scatter_add(grad_window) : at::Tensor());
    stack->push_back(mask[1] ? grad_weight : at::Tensor());
    stack->push_back(mask[2] ? grad_bias : at::Tensor());
  };
}

// Transposed convolution: this rank's rows' contributions, added where they land.
LocalKernel transposed_forward(ConvPlan plan) {
  return [plan](const c10::OperatorHandle& op, torch::jit::Stack* stack) {
    std::vector<c10::IValue> args = pop_arguments(op, stack);
    const at::Tensor input = args[0].toTensor(), weight = args[1].toTensor();
    const c10::optional<at::Tensor> bias = args[2].toOptional<at::Tensor>();
    at::Tensor contributions;
    if (plan.empty_here(input)) {  // no rows here, so no contributions
      contributions = at::zeros(plan.local_result_shape(input, weight.size(1) * plan.params.groups), input.options());
    } else {
      contributions = at::convolution(input, weight, c10::nullopt, plan.params.stride, plan.local_padding, plan.params.dilation,
                                      true, plan.local_output_padding, plan.params.groups);
    }
    at::Tensor output = plan.axes.scatter_add(contributions);
    if (bias && bias->defined()) {
      std::vector<int64_t> shape(output.dim(), 1);
      shape[1] = bias->numel();
      output.add_(bias->view(shape));
    }
    stack->push_back(output);
  };
}

LocalKernel transposed_backward(ConvPlan plan) {
  return [plan](const c10::OperatorHandle& op, torch::jit::Stack* stack) {
    std::vector<c10::IValue> args = pop_arguments(op, stack);
    const at::Tensor grad = args[0].toTensor(), input = args[1].toTensor(), weight = args[2].toTensor();
    const std::vector<bool> mask = {args[10].toBoolList().get(0), args[10].toBoolList().get(1), args[10].toBoolList().get(2)};
    const at::Tensor grad_window = plan.axes.gather(grad, 0.0);
    at::Tensor grad_input, grad_weight;
    if (plan.empty_here(input) || grad_window.numel() == 0) {
      grad_input = at::zeros_like(input);
      grad_weight = at::zeros_like(weight);
    } else {
      std::tie(grad_input, grad_weight, std::ignore) = at::convolution_backward(
          grad_window, input, weight, c10::nullopt, plan.params.stride, plan.local_padding, plan.params.dilation, true,
          plan.local_output_padding, plan.params.groups, {mask[0], mask[1], false});
    }
    std::vector<int64_t> reduce_dims = {0};
    for (int64_t d = 2; d < grad.dim(); ++d) reduce_dims.push_back(d);
    stack->push_back(mask[0] ? grad_input : at::Tensor());
    stack->push_back(mask[1] ? grad_weight : at::Tensor());
    stack->push_back(mask[2] ? grad.sum(reduce_dims) : at::Tensor());
  };
}

// convolution(input, weight, bias?, stride, padding, dilation, transposed, output_padding, groups)
RuleResult convolution_rule(const OpMeta& op) {
  const ShardTensorSpec& weight = op.inputs[1].spec;
  const ConvParams p = conv_params(op, 3, weight);
  const ShardTensorSpec in = spatial_layout(op.inputs[0].spec, p.spatial, /*channel_whole=*/true);
  RuleResult r;
  r.input_targets = {in};
  for (size_t k = 1; k < op.inputs.size(); ++k) r.input_targets.push_back(replicated(op.inputs[k].spec));
  OutputLayout out = layout_of(in);
  const ConvPlan plan = conv_plan(in, p, &out);
  r.outputs = {out};
  if (!plan.axes.axes.empty()) r.local_kernel = p.transposed ? transposed_forward(plan) : regular_forward(plan);
  return r;
}

// convolution_backward(grad_output, input, weight, bias_sizes?, stride, padding, dilation,
// transposed, output_padding, groups, output_mask) -> (grad_input, grad_weight, grad_bias)
RuleResult convolution_backward_rule(const OpMeta& op) {
  const ShardTensorSpec& weight = op.input_at(2)->spec;
  const ConvParams p = conv_params(op, 4, weight);
  const ShardTensorSpec in = spatial_layout(op.input_at(1)->spec, p.spatial, /*channel_whole=*/true);
  OutputLayout out = layout_of(in);
  const ConvPlan plan = conv_plan(in, p, &out);
  RuleResult r;
  r.input_targets = {laid_out(op.inputs[0].spec, out), in, replicated(weight)};
  const OutputLayout summed{summed_over_shards(in), {}};
  r.outputs = {layout_of(in), summed, summed};
  if (!plan.axes.axes.empty()) r.local_kernel = p.transposed ? transposed_backward(plan) : regular_backward(plan);
  return r;
}

}  // namespace

void register_convolution_rules(RuleRegistry& registry) {
  registry.add("aten::convolution", convolution_rule);
  registry.add("aten::convolution_backward", convolution_backward_rule);
}

}  // namespace shardtensor
