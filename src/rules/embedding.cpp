// Embedding lookups. The output is laid out like the indices, with the embedding dim whole.
// A replicated table is looked up as is. A table split by vocabulary rows (Shard(0)) on some
// mesh dims, where the indices are whole, is looked up locally instead of gathered: each rank
// answers the indices in its own rows and zeros elsewhere, a Partial(sum) over those mesh dims
// (MaskedLookupPlan, DTensor's MaskPartial: see Note [Lookups along a split dim] in
// rules/embedding.h, which gather and index_select share). A table split by the embedding dim
// (Shard(1), colwise) where the indices are whole is looked up locally too: each rank reads its
// columns, and the output is split on its last dim alike, with no message. Any other table
// layout is replicated.
//
// The table's gradient sums rows over all indices, so it is Partial(sum) on every mesh dim
// that shards the indices (unless gradients are scaled by global frequencies, which need every
// index: then the indices are gathered). embedding_dense_backward sees only num_weights, not
// how the table was split, so it builds the whole table's gradient; where the indices are
// whole that gradient is Replicate and the leaf's layout (dispatch/relayout.h) cuts it into the
// table's rows locally.
#include "rules/embedding.h"
#include "rules/helpers.h"
#include "spec/sequence_order.h"

namespace shardtensor {

std::vector<int64_t> lookup_split_mesh_dims(const ShardTensorSpec& table, int64_t tensor_dim, const ShardTensorSpec& index) {
  std::vector<int64_t> mesh_dims;
  for (int64_t m = 0; m < static_cast<int64_t>(table.placements().size()); ++m) {
    const Placement& p = table.placements()[m];
    if (p.is_replicate()) continue;
    // Another dim split, a Partial table, or the index split where the table is: no local lookup.
    if (!p.is_shard(tensor_dim) || index.placements()[m].is_shard()) return {};
    mesh_dims.push_back(m);
  }
  return mesh_dims;
}

namespace {

// embedding(weight, indices, padding_idx, scale_grad_by_freq, sparse). padding_idx only
// matters to the backward, so the forward's local lookup ignores it, as libtorch's does.
RuleResult embedding_rule(const OpMeta& op) {
  const ShardTensorSpec& table = op.inputs[0].spec;
  // The masked lookup reads the table's rows at their offsets, which a zigzag split has not.
  if (has_zigzag(table)) return RuleResult::unsupported("a table split in zigzag order is looked up in order");
  const ShardTensorSpec indices = without_partial(op.inputs[1].spec);
  // The vocabulary rows (dim 0) split where the indices are whole; not a 2-d table: the op raises.
  const std::vector<int64_t> vocab = table.ndim() == 2 ? lookup_split_mesh_dims(table, 0, indices) : std::vector<int64_t>{};
  RuleResult r;
  r.outputs = {layout_of(indices)};
  const std::vector<int64_t> columns = table.ndim() == 2 ? lookup_split_mesh_dims(table, 1, indices) : std::vector<int64_t>{};
  if (!columns.empty()) {
    r.input_targets = {table, indices};
    for (int64_t m : columns) r.outputs[0].placements[m] = Shard(indices.ndim());
    r.outputs[0].sizes.push_back({indices.ndim(), table.sharding_of(1)->sizes});
    return r;
  }
  if (vocab.empty()) {
    r.input_targets = {replicated(table), indices};
    return r;
  }
  r.input_targets = {table, indices};
  for (int64_t m : vocab) r.outputs[0].placements[m] = Partial(ReduceOp::Sum);
  r.kernel_plan = declare(MaskedLookupPlan(table, /*tensor_dim=*/0, op.arg_index("weight"), op.arg_index("indices"),
                                           LookupMask::kTrailingDim, "embedding"));
  return r;
}

// embedding_dense_backward(grad_output, indices, num_weights, padding_idx, scale_grad_by_freq)
RuleResult embedding_backward_rule(const OpMeta& op) {
  const bool by_frequency = bool_arg(op, "scale_grad_by_freq");
  const ShardTensorSpec& grad = op.inputs[0].spec;
  ShardTensorSpec indices = without_partial(op.inputs[1].spec);
  if (by_frequency) indices = replicated(indices);
  // grad_output is [*indices.shape, D]: its leading dims follow the indices. Where it splits D
  // on mesh dims where the indices are whole (a colwise table's lookup), the table's gradient
  // is split on its columns alike, computed locally.
  const int64_t last = grad.ndim() - 1;
  const DimSharding* d_split = last >= 0 ? grad.sharding_of(last) : nullptr;
  bool columns = d_split != nullptr;
  for (int64_t m : d_split ? d_split->mesh_dims : std::vector<int64_t>{}) columns = columns && !indices.placements()[m].is_shard();
  RuleResult r;
  if (!columns) {
    r.input_targets = {align_to(grad, indices), indices};
    r.outputs = {{summed_over_shards(indices), {}}};
    return r;
  }
  Placements grad_ps = indices.placements(), out_ps = summed_over_shards(indices);
  for (int64_t m : d_split->mesh_dims) {
    grad_ps[m] = Shard(last);
    out_ps[m] = Shard(1);
  }
  ShardTensorSpec grad_target = with_placements(grad, grad_ps);
  for (const DimSharding& s : indices.shardings()) grad_target = with_dim_sizes(grad_target, s.tensor_dim, s.sizes);
  grad_target = with_dim_sizes(grad_target, last, d_split->sizes);
  r.input_targets = {grad_target, indices};
  r.outputs = {{out_ps, {{1, d_split->sizes}}}};
  return r;
}

}  // namespace

void register_embedding_rules(RuleRegistry& registry) {
  registry.add("aten::embedding", embedding_rule);
  registry.add("aten::embedding_dense_backward", embedding_backward_rule);
  // The output is laid out like the indices, whose zigzag order it keeps.
  registry.carry_order("aten::embedding");
  registry.carry_order("aten::embedding_dense_backward");
}

}  // namespace shardtensor
