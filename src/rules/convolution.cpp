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
// convolution with no padding on the sharded dims. Backward needs the same window: it rebuilds
// it from the rows the forward received where the forward kept them (kernels/window_cache.h:
// one split axis, grad mode on), else gathers it again; it runs the local convolution_backward,
// and sends the input gradient's halo parts back to their owners, where they are added
// (scatter_add_window). Weight and bias gradients are
// Partial(sum) over every mesh dim that shards the input.
//
// Transposed convolution is the adjoint: each rank computes the full contribution of its
// own input rows (a window of the output reaching past its shard), and the overlaps are sent
// to their owners and added; the bias is added once by the owner. Its backward gathers the
// output gradient's window, which is a regular convolution.
#include "rules/convolution.h"

namespace shardtensor {
namespace {

// convolution and convolution_backward name their geometry arguments alike (the backward has
// grad_output first and bias_sizes for bias, so the positions differ by one).
ConvParams conv_params(const OpMeta& op, const ShardTensorSpec& weight) {
  ConvParams p;
  p.spatial = weight.ndim() - 2;
  for (int64_t i = 0; i < p.spatial; ++i) p.kernel.push_back(weight.shape()[2 + i]);
  p.stride = expand_param(op, "stride", p.spatial, {1});
  p.padding = expand_param(op, "padding", p.spatial, {0});
  p.dilation = expand_param(op, "dilation", p.spatial, {1});
  p.transposed = bool_arg(op, "transposed");
  p.output_padding = expand_param(op, "output_padding", p.spatial, {0});
  p.groups = int_arg(op, "groups");
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

ConvolutionPlan conv_plan(const ShardTensorSpec& in, const ConvParams& p, ConvolutionPlan::Pass pass, OutputLayout* out) {
  ConvolutionPlan plan(in.mesh());
  plan.pass = pass;
  plan.params = p;
  plan.local_padding = p.padding;
  plan.local_output_padding = p.output_padding;
  const int64_t first_spatial = in.ndim() - p.spatial;
  for (int64_t d : sharded_spatial_dims(in, p.spatial)) {
    const int64_t i = d - first_spatial;
    if (p.transposed) {
      HaloAxis axis = transposed_axis(in, d, p);
      *out = with_output_sizes(*out, d, axis.owned);
      plan.outputs.push_back(axis.owned);
      plan.halo.axes.push_back(std::move(axis));
    } else {
      const int64_t length = in.shape()[d];
      const SlidingWindow w{p.extent(i), p.stride[i], p.padding[i], (length + 2 * p.padding[i] - p.extent(i)) / p.stride[i] + 1};
      TORCH_CHECK(length + 2 * p.padding[i] >= p.extent(i), "convolution: the padded input (", length, " + 2 * ",
                  p.padding[i], ") along dim ", d, " is smaller than the kernel extent ", p.extent(i));
      HaloAxis axis = sliding_axis(in, d, w);
      plan.outputs.push_back(sliding_outputs(axis.owned, w));
      *out = with_output_sizes(*out, d, plan.outputs.back());
      plan.halo.axes.push_back(std::move(axis));
    }
    plan.local_padding[i] = 0;
    plan.local_output_padding[i] = 0;
  }
  return plan;
}

// convolution(input, weight, bias?, stride, padding, dilation, transposed, output_padding, groups)
RuleResult convolution_rule(const OpMeta& op) {
  const ShardTensorSpec& weight = op.inputs[1].spec;
  const ConvParams p = conv_params(op, weight);
  const ShardTensorSpec in = spatial_layout(op.inputs[0].spec, p.spatial, /*channel_whole=*/true);
  RuleResult r;
  r.input_targets = {in};
  for (size_t k = 1; k < op.inputs.size(); ++k) r.input_targets.push_back(replicated(op.inputs[k].spec));
  OutputLayout out = layout_of(in);
  ConvolutionPlan plan = conv_plan(in, p, ConvolutionPlan::Pass::Forward, &out);
  r.outputs = {out};
  if (!plan.halo.axes.empty()) r.kernel_plan = declare(std::move(plan));
  return r;
}

// convolution_backward(grad_output, input, weight, bias_sizes?, stride, padding, dilation,
// transposed, output_padding, groups, output_mask) -> (grad_input, grad_weight, grad_bias)
RuleResult convolution_backward_rule(const OpMeta& op) {
  const ShardTensorSpec& weight = op.input_named("weight")->spec;
  const ConvParams p = conv_params(op, weight);
  const ShardTensorSpec in = spatial_layout(op.input_named("input")->spec, p.spatial, /*channel_whole=*/true);
  OutputLayout out = layout_of(in);
  ConvolutionPlan plan = conv_plan(in, p, ConvolutionPlan::Pass::Backward, &out);
  RuleResult r;
  r.input_targets = {laid_out(op.inputs[0].spec, out), in, replicated(weight)};
  const OutputLayout summed{summed_over_shards(in), {}};
  r.outputs = {layout_of(in), summed, summed};
  if (!plan.halo.axes.empty()) r.kernel_plan = declare(std::move(plan));
  return r;
}

}  // namespace

std::string ConvolutionPlan::name() const {
  return std::string("halo ") + (params.transposed ? "transposed " : "") + "convolution (" +
         (pass == Pass::Forward ? "forward" : "backward") + ")";
}

std::vector<MoveStep> ConvolutionPlan::moves() const {
  if (params.transposed) return pass == Pass::Forward ? halo_scatter_adds(halo) : halo_gathers(halo);
  std::vector<MoveStep> moves = halo_gathers(halo);  // regular: the input window
  if (pass == Pass::Backward) {
    if (halo.axes.size() == 1 && moves.size() == 1) std::get<HaloGatherStep>(moves[0]).skipped_where_kept = true;  // kernels/window_cache.h
    for (const MoveStep& m : halo_scatter_adds(halo)) moves.push_back(m);  // and its gradient sent back
  }
  return moves;
}

void register_convolution_rules(RuleRegistry& registry) {
  registry.add("aten::convolution", convolution_rule);
  registry.add("aten::convolution_backward", convolution_backward_rule);
}

}  // namespace shardtensor
