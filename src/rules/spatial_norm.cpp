// Batch norm and group norm over sharded batch and spatial dims, forward and backward
// (instance norm decomposes into batch norm on a [1, N*C, ...] view).
//
// The statistics are sums over dims that are split across ranks: each rank sums its piece
// (in double), one all-reduce per sharding mesh dim of the stacked [sum, sum of squares]
// completes them, and the normalisation itself is local. Counts are global, from the spec.
// The backward needs two more sums (of dy and of dy * (x - mean)), again one all-reduce.
// Batch norm's weight and bias gradients come out of those complete sums (Replicate); group
// norm's are per-channel sums over rows, Partial(sum) over the sharding mesh dims.
#include "rules/spatial_norm.h"

#include <ATen/core/function_schema.h>

namespace shardtensor {

std::vector<int64_t> all_but_channel(int64_t ndim) {
  std::vector<int64_t> dims = {0};
  for (int64_t d = 2; d < ndim; ++d) dims.push_back(d);
  return dims;
}

namespace {

int64_t global_count(const ShardTensorSpec& spec, const std::vector<int64_t>& dims) {
  int64_t n = 1;
  for (int64_t d : dims) n *= spec.shape()[d];
  return n;
}

// ---- batch norm ----

ShardTensorSpec channels_whole(const ShardTensorSpec& spec) { return spatial_layout(spec, spec.ndim() - 2, true); }

RuleResult batch_norm_rule_in(const OpMeta& op, bool training) {
  const ShardTensorSpec in = channels_whole(op.inputs[0].spec);
  if (training)
    for (const char* stat_name : {"running_mean", "running_var"})
      if (const TensorInput* stat = op.has_arg(stat_name) ? op.input_named(stat_name) : nullptr)
        TORCH_CHECK(stat->spec.is_replicated(), op.name, ": the running ",
                    stat_name == std::string("running_mean") ? "mean" : "variance",
                    " is updated in place, so it must be replicated (a Replicate ShardTensor, or a plain tensor inside an "
                    "ImplicitReplication scope); got ", stat->spec);
  RuleResult r;
  r.input_targets = {in};
  for (size_t k = 1; k < op.inputs.size(); ++k) r.input_targets.push_back(replicated(op.inputs[k].spec));
  const OutputLayout whole = replicated_layout(in.mesh());
  r.outputs = {layout_of(in), whole, whole};
  if (op.schema->returns().size() == 4) r.outputs.push_back(whole);  // _batch_norm_with_update's reserve
  const std::vector<int64_t> mesh_dims = sharding_mesh_dims(in);
  if (training && !mesh_dims.empty())
    r.kernel_plan = declare(SpatialNormPlan(SpatialNormPlan::Norm::Batch, false, in.mesh(), mesh_dims,
                                            global_count(in, all_but_channel(in.ndim()))));
  else
    r.kernel_plan = empty_safe({}, r.outputs.size() == 4
                                       ? std::vector<Follows>{Follows::AllDims, Follows::Nothing, Follows::Nothing, Follows::Nothing}
                                       : std::vector<Follows>{Follows::AllDims, Follows::Nothing, Follows::Nothing});
  return r;
}

RuleResult batch_norm_rule(const OpMeta& op) { return batch_norm_rule_in(op, bool_arg(op, "training")); }

// _batch_norm_with_update (training, the statistics updated) and _batch_norm_no_update
// (evaluation): batch norm's two forms without a training argument.
RuleResult batch_norm_training_rule(const OpMeta& op) { return batch_norm_rule_in(op, /*training=*/true); }

// Eval mode's batch norm while torch.compile traces: the running statistics, no training argument.
RuleResult batch_norm_no_training_rule(const OpMeta& op) { return batch_norm_rule_in(op, /*training=*/false); }

RuleResult batch_norm_backward_rule(const OpMeta& op) {
  const ShardTensorSpec in = channels_whole(op.input_named("input")->spec);
  RuleResult r;
  for (const TensorInput& input : op.inputs) {
    const std::string& arg = arg_name(op, input);
    r.input_targets.push_back(arg == "input" ? in : arg == "grad_out" ? align_to(input.spec, in) : replicated(input.spec));
  }
  const std::vector<int64_t> mesh_dims = sharding_mesh_dims(in);
  // native_batch_norm_backward says "train"; batch_norm_backward (of _batch_norm_with_update) "update".
  const bool train = op.has_arg("train") ? bool_arg(op, "train") : bool_arg(op, "update");
  if (train && !mesh_dims.empty()) {
    const OutputLayout whole = replicated_layout(in.mesh());
    r.outputs = {layout_of(in), whole, whole};
    r.kernel_plan = declare(SpatialNormPlan(SpatialNormPlan::Norm::Batch, true, in.mesh(), mesh_dims,
                                            global_count(in, all_but_channel(in.ndim()))));
  } else {  // evaluation statistics: the gradient is local, weight and bias gradients are sums over rows
    const OutputLayout summed{summed_over_shards(in), {}};
    r.outputs = {layout_of(in), summed, summed};
    r.kernel_plan = empty_safe({}, {Follows::AllDims, Follows::Nothing, Follows::Nothing});
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
  if (!in.shardings().empty())
    r.kernel_plan = empty_safe(declare(SpatialNormPlan(SpatialNormPlan::Norm::Group, false, in.mesh(), spatial_mesh_dims_of(in),
                                                       spatial_count_of(in))),
                               {Follows::AllDims, Follows::BatchDim, Follows::BatchDim});
  return r;
}

RuleResult group_norm_backward_rule(const OpMeta& op) {
  const ShardTensorSpec in = channels_whole(op.input_named("input")->spec);
  const OutputLayout stats = stats_layout(in);
  RuleResult r;
  r.input_targets = norm_backward_targets(op, in, stats, replicated);  // weight: replicated
  const OutputLayout summed{summed_over_shards(in), {}};
  r.outputs = {layout_of(in), summed, summed};
  if (!in.shardings().empty())
    r.kernel_plan = empty_safe(declare(SpatialNormPlan(SpatialNormPlan::Norm::Group, true, in.mesh(), spatial_mesh_dims_of(in),
                                                       spatial_count_of(in))),
                               {Follows::AllDims, Follows::Nothing, Follows::Nothing});
  return r;
}

}  // namespace

std::string SpatialNormPlan::name() const {
  return std::string(norm == Norm::Batch ? "batch norm" : "group norm") + " with statistics summed over shards" +
         (backward ? " (backward)" : " (forward)");
}

void register_spatial_norm_rules(RuleRegistry& registry) {
  registry.add("aten::native_batch_norm", batch_norm_rule);
  // What batch_norm decomposes into while torch.compile traces (the same arguments by name).
  registry.add("aten::_native_batch_norm_legit", batch_norm_rule);
  registry.add("aten::_native_batch_norm_legit_no_training", batch_norm_no_training_rule);
  registry.add("aten::_native_batch_norm_legit.no_stats", batch_norm_rule);
  registry.add("aten::_batch_norm_with_update", batch_norm_training_rule);
  registry.add("aten::_batch_norm_no_update", batch_norm_no_training_rule);
  registry.add("aten::native_batch_norm_backward", batch_norm_backward_rule);
  registry.add("aten::batch_norm_backward", batch_norm_backward_rule);
  registry.add("aten::native_group_norm", group_norm_rule);
  registry.add("aten::native_group_norm_backward", group_norm_backward_rule);
}

}  // namespace shardtensor
