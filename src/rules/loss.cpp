// Losses: mse_loss and nll_loss (the pieces cross_entropy decomposes into), forward and backward.
//
// Elementwise terms are computed where the rows live; a sum over sharded rows is
// Partial(sum). A mean divides the local sum by the GLOBAL count, never the local one (with
// uneven shards an average of averages is wrong). nll_loss's count is data-dependent (ignored
// targets, class weights), so its mean reduces the total weight across the sharded mesh dims
// inside the kernel: one scalar all-reduce, the only communication a loss needs.
#include "rules/helpers.h"
#include "rules/loss.h"

namespace shardtensor {
namespace {

constexpr int64_t kReductionNone = 0, kReductionMean = 1;

// mse_loss(self, target, reduction)
RuleResult mse_loss_rule(const OpMeta& op) {
  const ShardTensorSpec self = without_partial(op.inputs[0].spec);
  const int64_t reduction = int_arg(op, "reduction");
  RuleResult r;
  r.input_targets = {self, align_to(op.inputs[1].spec, self)};
  if (reduction == kReductionNone) {
    r.outputs = {layout_of(self)};
    return r;
  }
  r.outputs = {{summed_over_shards(self), {}}};
  if (reduction == kReductionMean && !self.shardings().empty())
    r.kernel_plan = declare(SumThenDividePlan(numel_of(self)));
  return r;
}

// mse_loss_backward(grad_output, self, target, reduction)
RuleResult mse_loss_backward_rule(const OpMeta& op) {
  const ShardTensorSpec self = without_partial(op.inputs[1].spec);
  const int64_t reduction = int_arg(op, "reduction");
  RuleResult r;
  const ShardTensorSpec grad = reduction == kReductionNone ? align_to(op.inputs[0].spec, self) : replicated(op.inputs[0].spec);
  r.input_targets = {grad, self, align_to(op.inputs[2].spec, self)};
  r.outputs = {layout_of(self)};
  if (reduction == kReductionMean && !self.shardings().empty())
    r.kernel_plan = declare(SumThenDividePlan(numel_of(self)));
  return r;
}

// nll_loss_forward / nll_loss2d_forward(self, target, weight?, reduction, ignore_index)
// -> (output, total_weight). self is [N, C, *] (or [C]); target is self without the class dim.
ShardTensorSpec class_dim_whole(const ShardTensorSpec& self) {
  return replicate_tensor_dims(self, {self.ndim() >= 2 ? 1 : 0});
}

// Where each dim of self ([N, C, *] or [C]) goes once the class dim is dropped (-1: gone).
std::vector<int64_t> without_class_dim(int64_t ndim) {
  std::vector<int64_t> dim_map(ndim, -1);
  for (int64_t d = 0; ndim >= 2 && d < ndim; ++d) dim_map[d] = d == 0 ? 0 : d == 1 ? -1 : d - 1;
  return dim_map;
}

// The target laid out like `self` without its class dim.
ShardTensorSpec target_like(const ShardTensorSpec& target, const ShardTensorSpec& self) {
  const std::vector<int64_t> to_target = without_class_dim(self.ndim());
  Placements ps(self.placements().size(), Replicate());
  for (size_t m = 0; m < ps.size(); ++m)
    if (self.placements()[m].is_shard()) ps[m] = moved_to_dim(self.placements()[m], to_target[self.placements()[m].tensor_dim]);
  ShardTensorSpec t = with_placements(target, ps);
  for (const DimSharding& s : self.shardings()) t = with_dim_sizes(t, to_target[s.tensor_dim], s.sizes);
  return t;
}

OutputLayout remove_class_dim(const ShardTensorSpec& self) { return remap_dims(self, without_class_dim(self.ndim())); }

RuleResult nll_loss_rule(const OpMeta& op) {
  const ShardTensorSpec self = class_dim_whole(op.inputs[0].spec);
  const int64_t reduction = int_arg(op, "reduction");
  RuleResult r;
  r.input_targets = {self, target_like(op.inputs[1].spec, self)};
  for (size_t k = 2; k < op.inputs.size(); ++k) r.input_targets.push_back(replicated(op.inputs[k].spec));  // weight
  const OutputLayout whole = replicated_layout(self.mesh());
  if (reduction == kReductionNone) {
    r.outputs = {remove_class_dim(self), whole};
    return r;
  }
  const OutputLayout summed{summed_over_shards(self), {}};
  if (reduction != kReductionMean || self.shardings().empty()) {
    r.outputs = {summed, reduction == kReductionMean ? whole : summed};
    return r;
  }
  r.outputs = {summed, whole};
  r.kernel_plan = declare(NllGlobalMeanPlan(self.mesh(), sharding_mesh_dims(self)));
  return r;
}

// nll_loss_backward / nll_loss2d_backward(grad_output, self, target, weight?, reduction,
// ignore_index, total_weight): local once total_weight is the global one.
RuleResult nll_loss_backward_rule(const OpMeta& op) {
  const ShardTensorSpec self = class_dim_whole(op.input_named("self")->spec);
  const int64_t reduction = int_arg(op, "reduction");
  RuleResult r;
  for (const TensorInput& in : op.inputs) {
    const std::string& arg = arg_name(op, in);
    if (arg == "grad_output")
      r.input_targets.push_back(reduction == kReductionNone ? target_like(in.spec, self) : replicated(in.spec));
    else if (arg == "self")
      r.input_targets.push_back(self);
    else if (arg == "target")
      r.input_targets.push_back(target_like(in.spec, self));
    else  // weight, total_weight
      r.input_targets.push_back(replicated(in.spec));
  }
  r.outputs = {layout_of(self)};
  return r;
}

}  // namespace

void register_loss_rules(RuleRegistry& registry) {
  registry.add("aten::mse_loss", mse_loss_rule);
  registry.add("aten::mse_loss_backward", mse_loss_backward_rule);
  for (const char* name : {"aten::nll_loss_forward", "aten::nll_loss2d_forward"}) registry.add(name, nll_loss_rule);
  for (const char* name : {"aten::nll_loss_backward", "aten::nll_loss2d_backward"}) registry.add(name, nll_loss_backward_rule);
  // Position by position, then sums over positions: a zigzag order is kept or summed away.
  for (const char* name : {"aten::mse_loss", "aten::mse_loss_backward", "aten::nll_loss_forward", "aten::nll_loss2d_forward",
                           "aten::nll_loss_backward", "aten::nll_loss2d_backward"})
    registry.carry_order(name);
}

}  // namespace shardtensor
