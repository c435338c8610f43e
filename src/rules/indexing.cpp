// gather, scatter (src, value, reduce), scatter_add, scatter_reduce and gather's backward;
// advanced indexing (index.Tensor) and index_put.
//
// All of them index along one dim: that dim is gathered first. The other dims keep the lead
// tensor's sharding (self; for gather_backward, self too) when every operand has the same
// size there, so that index, src and self meet piece by piece; a sharded dim where the
// operands differ in size (gather allows a smaller index) is gathered as well. Indices are
// global positions along the gathered dim, so they need no rewriting. gather and indexing pick
// values, so a Partial self stays Partial; index_put keeps one where writing distributes over
// it (index_put_rule). scatter resolves Partial operands.
//
// One exception: gather from a self split along the gathered dim (and whole on every other
// mesh dim) by an index whole where self is split answers each rank's own range locally into a
// Partial(sum), and its backward adds into each rank's own range (see Note [Lookups along a
// split dim] in rules/embedding.h).
#include "rules/contribution.h"
#include "rules/embedding.h"
#include "rules/indexing.h"
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

// scatter*(self, dim, index, src or value[, reduce]): self leads, every operand follows it.
RuleResult scatter_rule(const OpMeta& op) {
  const ShardTensorSpec& lead = op.input_named("self")->spec;
  const ShardTensorSpec layout = indexing_layout(lead, wrap_dim(int_arg(op, "dim"), lead.ndim(), op), op);
  RuleResult r;
  for (const TensorInput& in : op.inputs) r.input_targets.push_back(follow(in.spec, layout));
  r.outputs = {layout_of(layout)};
  return r;
}

// gather(self, dim, index): the output has index's shape, so it follows index's layout,
// which follows self's. Where self splits `dim` and the index is whole there, self stays split
// and each rank answers its own range (see Note [Lookups along a split dim]).
RuleResult gather_rule(const OpMeta& op) {
  const ShardTensorSpec& self = op.inputs[0].spec;
  const int64_t dim = wrap_dim(int_arg(op, "dim"), self.ndim(), op);
  const ShardTensorSpec layout = indexing_layout(self, dim, op);
  const ShardTensorSpec index = follow(op.inputs[1].spec, layout);
  RuleResult r;
  r.outputs = {layout_of(keep_shared_partials(index, {self}))};  // picking values keeps them pending
  const std::vector<int64_t> split = lookup_split_mesh_dims(self, dim, op.inputs[1].spec);
  if (split.empty()) {
    r.input_targets = {keep_shared_partials(layout, {self}), index};
    return r;
  }
  // self is Shard(dim) on `split` and Replicate elsewhere, so `layout` and the index are whole.
  r.input_targets = {self, index};
  for (int64_t m : split) r.outputs[0].placements[m] = Partial(ReduceOp::Sum);
  r.kernel_plan = declare(MaskedLookupPlan(self, dim, op.arg_index("self"), op.arg_index("index"), LookupMask::kIndexShape, "gather"));
  return r;
}

// gather_backward(grad, self, dim, index, sparse_grad): libtorch builds plain zeros of self's
// size; here each rank scatters its gradient rows into zeros of its own piece. Where gather
// answered along a split dim (lookup_split_mesh_dims), self stays split and each rank adds only
// the entries in its own range: the gradient comes back in self's layout with no move.
RuleResult gather_backward_rule(const OpMeta& op) {
  const ShardTensorSpec& self = op.input_named("self")->spec;
  const int64_t dim = wrap_dim(int_arg(op, "dim"), self.ndim(), op);
  const ShardTensorSpec layout = indexing_layout(self, dim, op);
  const std::vector<int64_t> split = lookup_split_mesh_dims(self, dim, op.input_named("index")->spec);
  RuleResult r;
  for (const TensorInput& in : op.inputs)
    r.input_targets.push_back(!split.empty() && arg_name(op, in) == "self" ? self : follow(in.spec, layout));
  r.outputs = {layout_of(split.empty() ? layout : self)};
  r.kernel_plan = declare(GatherBackwardPlan(dim, split.empty() ? std::nullopt : std::optional<ShardTensorSpec>(self)));
  return r;
}

// ---- advanced indexing: self[i0, None, i2] and index_put ----

// Which dims of self an index list consumes, and where self's other dims land in the result.
struct AdvancedIndex {
  std::vector<int64_t> indexed;   // self dims with an index tensor
  std::vector<int64_t> dim_map;   // self dim -> result dim (-1: consumed)
  bool masks = false;             // a bool/byte index: data-dependent shape, everything gathered
  std::vector<int64_t> result_shape;
};

// The broadcast of shapes `a` and `b` (at::infer_size's arithmetic, without pulling tensor ops
// into a rule).
std::vector<int64_t> broadcast_shape(const std::vector<int64_t>& a, c10::IntArrayRef b) {
  const size_t n = std::max(a.size(), b.size());
  std::vector<int64_t> out(n);
  for (size_t k = 0; k < n; ++k) {
    const int64_t sa = k < n - a.size() ? 1 : a[k - (n - a.size())];
    const int64_t sb = k < n - b.size() ? 1 : b[k - (n - b.size())];
    TORCH_CHECK(sa == sb || sa == 1 || sb == 1, "The size of tensor a (", sa, ") must match the size of tensor b (", sb,
                ") at non-singleton dimension ", k);
    out[k] = sa == 1 ? sb : sa;
  }
  return out;
}

AdvancedIndex advanced_index(const OpMeta& op, const ShardTensorSpec& self) {
  AdvancedIndex a;
  const c10::List<c10::IValue> list = op.arg("indices").toList();
  std::vector<int64_t> broadcast;
  for (size_t i = 0; i < list.size(); ++i) {
    const c10::IValue e = list.get(i);
    if (e.isNone() || !e.toTensor().defined()) continue;
    const at::Tensor& index = e.toTensor();
    if (index.scalar_type() == at::kBool || index.scalar_type() == at::kByte) a.masks = true;
    a.indexed.push_back(static_cast<int64_t>(i));
    broadcast = broadcast_shape(broadcast, index.sizes());
  }
  bool adjacent = true;
  for (size_t k = 1; k < a.indexed.size(); ++k) adjacent = adjacent && a.indexed[k] == a.indexed[k - 1] + 1;
  const int64_t b = static_cast<int64_t>(broadcast.size()), first = a.indexed.empty() ? 0 : a.indexed.front();
  a.dim_map.assign(self.ndim(), -1);
  int64_t next = adjacent ? 0 : b;
  for (int64_t d = 0; d < self.ndim(); ++d) {
    if (std::count(a.indexed.begin(), a.indexed.end(), d)) {
      if (adjacent && d == first) next += b;  // the broadcast dims sit where the indexed ones were
      continue;
    }
    a.dim_map[d] = next++;
  }
  a.result_shape.assign(next > b ? next : b, 0);
  for (int64_t d = 0; d < self.ndim(); ++d)
    if (a.dim_map[d] >= 0) a.result_shape[a.dim_map[d]] = self.shape()[d];
  for (int64_t k = 0; k < b; ++k) a.result_shape[(adjacent ? first : 0) + k] = broadcast[k];
  return a;
}

// self with its indexed dims gathered (everything, for masks).
ShardTensorSpec indexed_layout(const ShardTensorSpec& self, const AdvancedIndex& a) {
  return a.masks ? replicated(self) : replicate_tensor_dims(without_partial(self), a.indexed);
}

// index.Tensor(self, indices): the other dims keep self's sharding, moved to their result dims.
RuleResult index_rule(const OpMeta& op) {
  const AdvancedIndex a = advanced_index(op, op.inputs[0].spec);
  const ShardTensorSpec self = keep_shared_partials(indexed_layout(op.inputs[0].spec, a), {op.inputs[0].spec});
  RuleResult r;
  r.input_targets.push_back(self);
  for (size_t k = 1; k < op.inputs.size(); ++k) r.input_targets.push_back(replicated(op.inputs[k].spec));
  r.outputs = {a.masks ? layout_of(keep_shared_partials(replicated(self), {self})) : remap_dims(self, a.dim_map)};
  return r;
}

// index_put(_)/_index_put_impl(_)(self, indices, values, accumulate[, unsafe]): values shaped
// like the indexing result follow its layout; broadcast values are gathered.
// A Partial self stays Partial where writing (or adding) values distributes over its
// reduction: always for sum and avg, without accumulate for max and min. Values of the same
// Partial stay so; replicated values join a P(sum) once (rules/contribution.h).
RuleResult index_put_rule(const OpMeta& op) {
  const AdvancedIndex a = advanced_index(op, op.inputs[0].spec);
  const ShardTensorSpec& given = op.inputs[0].spec;
  const bool accumulate = bool_arg(op, "accumulate");
  Placements kept = given.placements();
  for (Placement& p : kept) {
    const bool sums = p.is_partial() && (p.reduce_op == ReduceOp::Sum || p.reduce_op == ReduceOp::Avg);
    const bool orders = p.is_partial() && (p.reduce_op == ReduceOp::Max || p.reduce_op == ReduceOp::Min);
    if (p.is_partial() && !sums && !(orders && !accumulate)) p = Replicate();
  }
  const ShardTensorSpec self = keep_shared_partials(indexed_layout(given, a), {with_placements(given, kept)});
  const OutputLayout result = a.masks ? replicated_layout(self.mesh()) : remap_dims(without_partial(self), a.dim_map);
  RuleResult r;
  r.input_targets.push_back(self);
  std::vector<ContributedValue> contributed;
  for (size_t k = 1; k < op.inputs.size(); ++k) {
    const TensorInput& in = op.inputs[k];
    const bool values = arg_name(op, in) == "values";
    ShardTensorSpec target = values && in.spec.shape() == a.result_shape ? laid_out(without_partial(in.spec), result) : replicated(in.spec);
    if (values) {  // values of self's Partial stay pending; replicated ones join a P(sum) once
      Placements ps = target.placements();
      std::vector<int64_t> once;
      for (size_t m = 0; m < ps.size(); ++m) {
        const Placement& p = self.placements()[m];
        if (!p.is_partial()) continue;
        if (in.spec.placements()[m] == p) {
          ps[m] = p;
        } else if (p.reduce_op == ReduceOp::Sum) {
          once.push_back(static_cast<int64_t>(m));
        }
      }
      target = with_placements(target, ps);
      if (!once.empty()) contributed.push_back({in.arg_index, once});
    }
    r.input_targets.push_back(target);
  }
  r.outputs = {layout_of(self)};
  if (!contributed.empty()) r.kernel_plan = declare(ContributedOncePlan(self.mesh(), std::move(contributed)));
  return r;
}

// index_fill(self, dim, index, value) and index_reduce(self, dim, index, source, reduce, ...)
// write the positions of `dim` that the index names, so that dim is read whole; the other dims
// keep their shards, a source follows self (its `dim` may be shorter), and the index (and a
// tensor value) is read whole.
RuleResult index_along_dim_rule(const OpMeta& op) {
  const TensorInput& self = *op.input_named("self");
  const int64_t dim = wrap_dim(int_arg(op, "dim"), std::max<int64_t>(self.spec.ndim(), 1), op);
  const ShardTensorSpec target = replicate_tensor_dims(without_partial(self.spec), {dim});
  RuleResult r;
  for (const TensorInput& in : op.inputs) {
    if (in.arg_index == self.arg_index) r.input_targets.push_back(target);
    else if (arg_name(op, in) == "source") r.input_targets.push_back(follow(in.spec, target));
    else r.input_targets.push_back(replicated(in.spec));
  }
  r.outputs = {layout_of(target)};
  return r;
}

// bucketize(self, boundaries): each element's bucket among the (whole) boundaries, so self
// keeps its layout, Partials resolved.
RuleResult bucketize_rule(const OpMeta& op) {
  const ShardTensorSpec target = without_partial(op.input_named("self")->spec);
  RuleResult r;
  r.input_targets = {target, replicated(op.input_named("boundaries")->spec)};
  r.outputs = {layout_of(target)};
  return r;
}

}  // namespace

void register_indexing_rules(RuleRegistry& registry) {
  for (const char* name : {"aten::index_fill.int_Scalar", "aten::index_fill.int_Tensor", "aten::index_fill_.int_Scalar",
                           "aten::index_fill_.int_Tensor", "aten::index_reduce", "aten::index_reduce_"})
    registry.add(name, index_along_dim_rule);
  registry.add("aten::bucketize.Tensor", bucketize_rule);
  registry.add("aten::index.Tensor", index_rule);
  for (const char* name : {"aten::index_put_", "aten::index_put", "aten::_index_put_impl_"})
    registry.add(name, index_put_rule);
  registry.add("aten::gather", gather_rule);
  registry.add("aten::gather_backward", gather_backward_rule);
  for (const char* name : {"aten::scatter.src", "aten::scatter_.src", "aten::scatter.value", "aten::scatter_.value",
                           "aten::scatter.reduce", "aten::scatter_.reduce", "aten::scatter.value_reduce",
                           "aten::scatter_.value_reduce", "aten::scatter_add", "aten::scatter_add_", "aten::scatter_reduce.two",
                           "aten::scatter_reduce_.two"})
    registry.add(name, scatter_rule);
}

}  // namespace shardtensor
