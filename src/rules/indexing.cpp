// gather, scatter (src, value, reduce), scatter_add, scatter_reduce and gather's backward.
//
// All of them index along one dim: that dim is gathered first. The other dims keep the lead
// tensor's sharding (self; for gather_backward, self too) when every operand has the same
// size there, so that index, src and self meet piece by piece; a sharded dim where the
// operands differ in size (gather allows a smaller index) is gathered as well. Indices are
// global positions along the gathered dim, so they need no rewriting. Partial operands are
// resolved: scattering is not linear in what it overwrites.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include "rules/spatial.h"

namespace shardtensor {
namespace {

// The layout every operand of an indexing op along `dim` runs on, led by `lead`.
ShardTensorSpec indexing_layout(const ShardTensorSpec& lead, int64_t dim, const OpMeta& op) {
  std::vector<int64_t> gathered = {dim};
  for (const DimSharding& s : lead.shardings())
    for (const TensorInput& in : op.inputs)
      if (in.spec.ndim() == lead.ndim() && in.spec.shape()[s.tensor_dim] != lead.shape()[s.tensor_dim]) gathered.push_back(s.tensor_dim);
  return replicate_tensor_dims(without_partial(lead), gathered);
}

// `spec` (an operand of the same rank) laid out like `layout`.
ShardTensorSpec follow(const ShardTensorSpec& spec, const ShardTensorSpec& layout) {
  if (spec.ndim() != layout.ndim()) return replicated(spec);  // a 0-d index or src
  return ShardTensorSpec(spec.mesh(), layout.placements(), spec.shape(), spec.dtype(), layout.shard_sizes());
}

// Rules for ops whose lead is argument `lead_arg` and whose dim is argument `dim_arg`.
RuleResult indexing_rule(const OpMeta& op, size_t lead_arg, size_t dim_arg) {
  const ShardTensorSpec& lead = op.input_at(lead_arg)->spec;
  const ShardTensorSpec layout = indexing_layout(lead, wrap_dim(int_arg(op, dim_arg), lead.ndim(), op), op);
  RuleResult r;
  for (const TensorInput& in : op.inputs) r.input_targets.push_back(follow(in.spec, layout));
  r.outputs = {layout_of(layout)};
  return r;
}

// gather(self, dim, index): the output has index's shape, so it follows index's layout,
// which follows self's.
RuleResult gather_rule(const OpMeta& op) {
  const ShardTensorSpec& self = op.inputs[0].spec;
  const ShardTensorSpec layout = indexing_layout(self, wrap_dim(int_arg(op, 1), self.ndim(), op), op);
  RuleResult r;
  r.input_targets = {layout, follow(op.inputs[1].spec, layout)};
  r.outputs = {layout_of(r.input_targets[1])};
  return r;
}

// gather_backward(grad, self, dim, index, sparse_grad): libtorch builds plain zeros of self's
// size; here each rank scatters its gradient rows into zeros of its own piece.
RuleResult gather_backward_rule(const OpMeta& op) {
  const ShardTensorSpec& self = op.input_at(1)->spec;
  const int64_t dim = wrap_dim(int_arg(op, 2), self.ndim(), op);
  const ShardTensorSpec layout = indexing_layout(self, dim, op);
  RuleResult r;
  for (const TensorInput& in : op.inputs) r.input_targets.push_back(follow(in.spec, layout));
  r.outputs = {layout_of(layout)};
  r.local_kernel = [dim](const c10::OperatorHandle& op, torch::jit::Stack* stack) {
    const std::vector<c10::IValue> args = pop_arguments(op, stack);
    const at::Tensor grad = args[0].toTensor(), self = args[1].toTensor(), index = args[3].toTensor();
    stack->push_back(at::zeros(self.sizes(), grad.options()).scatter_add_(dim, index, grad));
  };
  return r;
}

}  // namespace

void register_indexing_rules(RuleRegistry& registry) {
  registry.add("aten::gather", gather_rule);
  registry.add("aten::gather_backward", gather_backward_rule);
  for (const char* name : {"aten::scatter.src", "aten::scatter_.src", "aten::scatter.value", "aten::scatter_.value",
                           "aten::scatter.reduce", "aten::scatter_.reduce", "aten::scatter.value_reduce",
                           "aten::scatter_.value_reduce", "aten::scatter_add", "aten::scatter_add_", "aten::scatter_reduce.two",
                           "aten::scatter_reduce_.two"})
    registry.add(name, [](const OpMeta& op) { return indexing_rule(op, 0, 1); });
}

}  // namespace shardtensor
