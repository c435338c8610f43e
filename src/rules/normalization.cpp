// Softmax, log_softmax and layer norm, forward and backward.
//
// Softmax reads whole rows along its dim: that dim is gathered first (a softmax over a
// sharded dim redistributes), every other dim keeps its sharding.
//
// Layer norm keeps even its normalised dims sharded: each rank sums its piece of every row,
// one all-reduce (per mesh dim splitting the normalised dims) of the stacked [sum, sum of
// squares] completes the statistics, and the normalisation is local; weight and bias are
// split like the normalised dims (a local chunk of a replicated parameter, no collective).
// The backward needs two more row sums, again one all-reduce. Weight and bias gradients are
// sums over rows: Partial(sum) on every mesh dim that shards rows.
#include "rules/normalization.h"
#include "rules/spatial.h"

namespace shardtensor {
namespace {

RuleResult softmax_rule(const OpMeta& op) {
  const ShardTensorSpec& in = op.inputs[0].spec;
  const int64_t dim = wrap_dim(int_arg(op, "dim"), in.ndim(), op);
  const ShardTensorSpec target = replicate_tensor_dims(in, {dim});
  RuleResult r;
  r.input_targets = {target};
  r.outputs = {layout_of(target)};
  return r;
}

// _softmax_backward_data(grad_output, output, dim, input_dtype)
RuleResult softmax_backward_rule(const OpMeta& op) {
  const ShardTensorSpec& grad = op.inputs[0].spec;
  const int64_t dim = wrap_dim(int_arg(op, "dim"), grad.ndim(), op);
  const ShardTensorSpec target = replicate_tensor_dims(grad, {dim});
  RuleResult r;
  r.input_targets = {target, align_to(op.inputs[1].spec, target)};
  r.outputs = {layout_of(target)};
  return r;
}

// ---- layer norm ----

LayerNormGeometry layer_norm_geometry(const ShardTensorSpec& in, size_t normalised) {
  LayerNormGeometry g;
  g.axis = in.ndim() - static_cast<int64_t>(normalised);
  for (int64_t d = g.axis; d < in.ndim(); ++d) g.count *= in.shape()[d];
  g.row_mesh_dims = sharding_mesh_dims(in, [&](int64_t d) { return d >= g.axis; });
  return g;
}

// A [normalized_shape] parameter (or its gradient) split like the input's normalised dims;
// `batch` is what the mesh dims splitting rows become (Replicate for a parameter, Partial(sum)
// for its gradient).
OutputLayout parameter_layout(const ShardTensorSpec& in, int64_t axis, Placement batch) {
  OutputLayout layout{Placements(in.placements().size(), Replicate()), {}};
  for (size_t m = 0; m < in.placements().size(); ++m) {
    const Placement& p = in.placements()[m];
    if (p.is_shard()) layout.placements[m] = p.tensor_dim >= axis ? moved_to_dim(p, p.tensor_dim - axis) : batch;
  }
  for (const DimSharding& s : in.shardings())
    if (s.tensor_dim >= axis) layout.sizes.push_back({s.tensor_dim - axis, s.sizes});
  return layout;
}

// mean and rstd ([rows..., 1, ...]): split like the rows, whole across the normalised dims.
OutputLayout row_stats_layout(const ShardTensorSpec& in, int64_t axis) {
  OutputLayout layout{Placements(in.placements().size(), Replicate()), {}};
  for (size_t m = 0; m < in.placements().size(); ++m)
    if (in.placements()[m].is_shard() && in.placements()[m].tensor_dim < axis) layout.placements[m] = in.placements()[m];
  for (const DimSharding& s : in.shardings())
    if (s.tensor_dim < axis) layout.sizes.push_back({s.tensor_dim, s.sizes});
  return layout;
}

RuleResult layer_norm_rule(const OpMeta& op) {
  const ShardTensorSpec in = without_partial(op.inputs[0].spec);
  const LayerNormGeometry g = layer_norm_geometry(in, int_list_arg(op, "normalized_shape").size());
  RuleResult r;
  r.input_targets.push_back(in);
  const OutputLayout param = parameter_layout(in, g.axis, Replicate());
  for (size_t k = 1; k < op.inputs.size(); ++k) r.input_targets.push_back(laid_out(op.inputs[k].spec, param));
  const OutputLayout stats = row_stats_layout(in, g.axis);
  r.outputs = {layout_of(in), stats, stats};
  if (!g.row_mesh_dims.empty()) r.kernel_plan = declare(LayerNormPlan(LayerNormPlan::Pass::Forward, in.mesh(), g));
  return r;
}

RuleResult layer_norm_backward_rule(const OpMeta& op) {
  const ShardTensorSpec in = without_partial(op.input_named("input")->spec);
  const LayerNormGeometry g = layer_norm_geometry(in, int_list_arg(op, "normalized_shape").size());
  const OutputLayout param = parameter_layout(in, g.axis, Replicate()), stats = row_stats_layout(in, g.axis);
  RuleResult r;
  r.input_targets = norm_backward_targets(op, in, stats, [&](const ShardTensorSpec& p) { return laid_out(p, param); });
  const OutputLayout summed = parameter_layout(in, g.axis, Partial(ReduceOp::Sum));
  r.outputs = {layout_of(in), summed, summed};
  if (!g.row_mesh_dims.empty()) r.kernel_plan = declare(LayerNormPlan(LayerNormPlan::Pass::Backward, in.mesh(), g));
  return r;
}

}  // namespace

void register_normalization_rules(RuleRegistry& registry) {
  for (const char* name : {"aten::_softmax", "aten::_log_softmax", "aten::_safe_softmax"}) registry.add(name, softmax_rule);
  for (const char* name : {"aten::_softmax_backward_data", "aten::_log_softmax_backward_data"})
    registry.add(name, softmax_backward_rule);
  registry.add("aten::native_layer_norm", layer_norm_rule);
  registry.add("aten::native_layer_norm_backward", layer_norm_backward_rule);
  // Rows keep their placements, and sums over a row do not depend on its order: a zigzag order
  // is kept (a softmax over a zigzag dim gathers it, in order).
  for (const char* name : {"aten::_softmax", "aten::_log_softmax", "aten::_softmax_backward_data", "aten::_log_softmax_backward_data",
                           "aten::native_layer_norm", "aten::native_layer_norm_backward"})
    registry.carry_order(name);
}

}  // namespace shardtensor
