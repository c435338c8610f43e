// Small pure transformations of specs and layouts that the rule families share. Each helper
// names one transformation; none communicates.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "rules/registry.h"

namespace shardtensor {

// `spec` with new placements: tensor dims sharded by the same mesh dims keep their sizes,
// newly sharded ones take torch.chunk sizes (see relayout in redistribute/plan.h).
ShardTensorSpec with_placements(const ShardTensorSpec& spec, const Placements& placements);

// `spec` with every Partial placement resolved to Replicate (an all-reduce when moved).
ShardTensorSpec without_partial(const ShardTensorSpec& spec);

// Partial kinds that a linear map (negation, scaling, conjugation, reinterpreting a complex
// number as two reals) keeps pending: sum and avg.
inline bool is_sum_or_avg(ReduceOp r) { return r == ReduceOp::Sum || r == ReduceOp::Avg; }
// `spec` with its Partials other than sum and avg resolved: the input layout of a linear map.
ShardTensorSpec keep_linear_partials(const ShardTensorSpec& spec);

// `spec` with every mesh dim that shards one of `tensor_dims` (or is Partial) made Replicate:
// what an operator needs when it reads those dims whole.
ShardTensorSpec replicate_tensor_dims(const ShardTensorSpec& spec, const std::vector<int64_t>& tensor_dims);

// `spec` with only its shards of the first `n` tensor dims kept (the rest, and Partials, made
// Replicate): the layout of an operator that treats its leading dims (batch, channels)
// independently and reads the trailing ones whole.
ShardTensorSpec keep_leading_dims(const ShardTensorSpec& spec, int64_t n);
// `spec` laid out with `lead`'s shards of the first `n` tensor dims (the same mesh dims and
// sizes; `lead` keeps only those), the rest Replicate: an operand that shares the lead's
// leading dims (a sampling grid's batch, an index's batch and channels).
ShardTensorSpec leading_like(const ShardTensorSpec& spec, const ShardTensorSpec& lead, int64_t n);
// `spec` with the size table of `tensor_dim` replaced by `sizes` (same mesh dims): aligns an
// operand's shard boundaries with another's.
ShardTensorSpec with_dim_sizes(const ShardTensorSpec& spec, int64_t tensor_dim, const std::vector<int64_t>& sizes);

// The number of elements of the global tensor.
int64_t numel_of(const ShardTensorSpec& spec);

// A fully replicated spec of the same shape and dtype.
ShardTensorSpec replicated(const ShardTensorSpec& spec);

// Shard placement `p` on tensor dim `dim` instead, its order kept: where a rule moves a shard to
// another dim position by position, a zigzag order moves with it.
inline Placement moved_to_dim(Placement p, int64_t dim) {
  p.tensor_dim = dim;
  return p;
}

// The layout of `spec` with every tensor dim d moved to dim_map[d] (-1: the dim disappears,
// and must not be sharded) in an output of `out_ndim` dims.
OutputLayout remap_dims(const ShardTensorSpec& spec, const std::vector<int64_t>& dim_map);

// A fully replicated output layout over `mesh`.
OutputLayout replicated_layout(const DeviceMesh& mesh);

// Wraps negative dims and checks the range, with the operator's name in the error.
int64_t wrap_dim(int64_t dim, int64_t ndim, const OpMeta& op);

// Reads the reduction dims of an int[]/int?/int[1]? argument: empty or None means all dims.
std::vector<int64_t> reduction_dims(const c10::IValue& arg, int64_t ndim, const OpMeta& op);

// Argument readers by schema name (OpMeta::arg), with defaults for None. Each raises, naming
// the operator and its arguments, when the schema has no such name.
int64_t int_arg(const OpMeta& op, const std::string& name);
bool bool_arg(const OpMeta& op, const std::string& name, bool if_none = false);
std::vector<int64_t> int_list_arg(const OpMeta& op, const std::string& name);
std::optional<int64_t> optional_int_arg(const OpMeta& op, const std::string& name);    // int?
std::optional<double> optional_double_arg(const OpMeta& op, const std::string& name);  // float?, Scalar?
// A float, int or Scalar argument as a double, whatever kind the caller passed: a Scalar holds
// an int or a bool where Python passed one (histc(x, min=0, max=12)), so never toDouble() it.
double number_arg(const OpMeta& op, const std::string& name);
// Rules read arguments by name only: a position would silently read another argument of an
// overload that orders them differently. Deleted so that int_arg(op, 3) does not compile
// (and int_arg(op, 0) does not become a null std::string).
int64_t int_arg(const OpMeta&, size_t) = delete;
bool bool_arg(const OpMeta&, size_t, bool = false) = delete;
std::vector<int64_t> int_list_arg(const OpMeta&, size_t) = delete;
std::optional<int64_t> optional_int_arg(const OpMeta&, size_t) = delete;
std::optional<double> optional_double_arg(const OpMeta&, size_t) = delete;
double number_arg(const OpMeta&, size_t) = delete;

// The schema name of the argument tensor input `in` came from ("grad_output", "self"): how a
// rule that treats its inputs differently tells them apart.
const std::string& arg_name(const OpMeta& op, const TensorInput& in);

// Mesh dims that shard a tensor dim d of `spec` with pred(d) (pred omitted: any dim).
std::vector<int64_t> sharding_mesh_dims(const ShardTensorSpec& spec, const std::function<bool(int64_t)>& pred = {});

// Mesh dims on which `spec` is Partial.
std::vector<int64_t> partial_mesh_dims(const ShardTensorSpec& spec);

// `spec` laid out like `lead` (same ndim): the same placements and, for sharded dims, the
// same shard sizes, so that operands meet piece by piece.
ShardTensorSpec align_to(const ShardTensorSpec& spec, const ShardTensorSpec& lead);

// `resolved` with a Partial restored on every mesh dim where it is Replicate and every operand
// of its rank holds one and the same Partial: ops that select or move values without combining
// them (cat, stack, gather, indexing, padding with a neutral value) keep a pending reduction
// pending. Operands of another rank are ignored (cat skips its legacy empty [0] inputs).
ShardTensorSpec keep_shared_partials(const ShardTensorSpec& resolved, const std::vector<ShardTensorSpec>& operands);

// Placements that turn every mesh dim on which `spec` is sharded into Partial(sum), the rest
// Replicate: the layout of a parameter's gradient summed over sharded rows.
Placements summed_over_shards(const ShardTensorSpec& spec);

}  // namespace shardtensor
