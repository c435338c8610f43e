// Embedding lookups with a replicated table: the output is laid out like the indices, with
// the embedding dim whole. The table's gradient sums rows over all indices, so it is
// Partial(sum) on every mesh dim that shards the indices (unless gradients are scaled by
// global frequencies, which need every index: then the indices are gathered).
#include "rules/helpers.h"

namespace shardtensor {
namespace {

// embedding(weight, indices, padding_idx, scale_grad_by_freq, sparse)
RuleResult embedding_rule(const OpMeta& op) {
  const ShardTensorSpec indices = without_partial(op.inputs[1].spec);
  RuleResult r;
  r.input_targets = {replicated(op.inputs[0].spec), indices};
  r.outputs = {layout_of(indices)};
  return r;
}

// embedding_dense_backward(grad_output, indices, num_weights, padding_idx, scale_grad_by_freq)
RuleResult embedding_backward_rule(const OpMeta& op) {
  const bool by_frequency = bool_arg(op, "scale_grad_by_freq");
  const ShardTensorSpec& grad = op.inputs[0].spec;
  ShardTensorSpec indices = without_partial(op.inputs[1].spec);
  if (by_frequency) indices = replicated(indices);
  // grad_output is [*indices.shape, D]: its leading dims follow the indices.
  RuleResult r;
  r.input_targets = {align_to(grad, indices), indices};
  r.outputs = {{summed_over_shards(indices), {}}};
  return r;
}

}  // namespace

void register_embedding_rules(RuleRegistry& registry) {
  registry.add("aten::embedding", embedding_rule);
  registry.add("aten::embedding_dense_backward", embedding_backward_rule);
}

}  // namespace shardtensor
