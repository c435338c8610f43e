// Embedding lookups. The output is laid out like the indices, with the embedding dim whole.
// A replicated table is looked up as is. A table split by vocabulary rows (Shard(0)) on some
// mesh dims, where the indices are whole, is looked up locally instead of gathered: each rank
// answers the indices in its own rows and zeros elsewhere, a Partial(sum) over those mesh dims
// (VocabShardedLookupPlan, DTensor's MaskPartial). Any other table layout is replicated.
//
// The table's gradient sums rows over all indices, so it is Partial(sum) on every mesh dim
// that shards the indices (unless gradients are scaled by global frequencies, which need every
// index: then the indices are gathered). embedding_dense_backward sees only num_weights, not
// how the table was split, so it builds the whole table's gradient; where the indices are
// whole that gradient is Replicate and the leaf's layout (dispatch/relayout.h) cuts it into the
// table's rows locally.
#include "rules/embedding.h"
#include "rules/helpers.h"

namespace shardtensor {
namespace {

// The mesh dims that split the table's rows, where every other mesh dim replicates it; empty
// for any other layout (rows split nowhere, the embedding dim split, a Partial table).
std::vector<int64_t> vocab_mesh_dims(const ShardTensorSpec& table) {
  if (table.ndim() != 2) return {};  // not a table: the op itself raises
  std::vector<int64_t> mesh_dims;
  for (int64_t m = 0; m < static_cast<int64_t>(table.placements().size()); ++m) {
    const Placement& p = table.placements()[m];
    if (p.is_shard(0)) mesh_dims.push_back(m);
    else if (!p.is_replicate()) return {};
  }
  return mesh_dims;
}

// embedding(weight, indices, padding_idx, scale_grad_by_freq, sparse). padding_idx only
// matters to the backward, so the forward's local lookup ignores it, as libtorch's does.
RuleResult embedding_rule(const OpMeta& op) {
  const ShardTensorSpec& table = op.inputs[0].spec;
  const ShardTensorSpec indices = without_partial(op.inputs[1].spec);
  const std::vector<int64_t> vocab = vocab_mesh_dims(table);
  bool local_rows = !vocab.empty();
  for (int64_t m : vocab) local_rows = local_rows && indices.placements()[m].is_replicate();
  RuleResult r;
  r.outputs = {layout_of(indices)};
  if (!local_rows) {
    r.input_targets = {replicated(table), indices};
    return r;
  }
  r.input_targets = {table, indices};
  for (int64_t m : vocab) r.outputs[0].placements[m] = Partial(ReduceOp::Sum);
  r.kernel_plan = declare(VocabShardedLookupPlan(table, op.arg_index("weight"), op.arg_index("indices")));
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
