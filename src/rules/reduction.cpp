// Reductions: sum, mean, prod, amax/amin, max/min, argmax/argmin, var/std, norms, all/any,
// logsumexp; over some dims (keepdim either way) or all of them.
//
// Over an unsharded dim a reduction is local. Over a sharded dim it becomes Partial when the
// per-rank results combine by one collective: sum -> P(sum); mean -> P(sum) of local sums over
// the GLOBAL count (uneven shards make an average of averages wrong); prod -> P(product);
// amax/amin -> P(max/min) unless some shard is empty (an empty max has no value). The others
// (indices, variances, norms, logsumexp, boolean all/any) gather the reduced dims first.
// A Partial(sum) input passes through sum and mean (they are linear); others resolve it.
#include <ATen/core/function_schema.h>

#include <algorithm>

#include "rules/helpers.h"
#include "rules/reduction.h"

namespace shardtensor {
namespace {

enum class Combine { Sum, Mean, Product, Max, Min, Gather };

struct ReductionArgs {
  int dims_arg;     // -1: reduces every dim
  int keepdim_arg;  // -1: never keeps dims
  Combine combine;
};

bool has_empty_piece(const ShardTensorSpec& spec, int64_t tensor_dim) {
  const DimSharding* s = spec.sharding_of(tensor_dim);
  return s && std::count(s->sizes.begin(), s->sizes.end(), 0) > 0;
}

// The Partial a sharded reduced dim turns into, or nullopt when it must be gathered.
std::optional<Placement> partial_for(Combine combine, const ShardTensorSpec& spec, int64_t tensor_dim) {
  switch (combine) {
    case Combine::Sum:
    case Combine::Mean:
      return Partial(ReduceOp::Sum);
    case Combine::Product:
      return Partial(ReduceOp::Product);
    case Combine::Max:
      if (has_empty_piece(spec, tensor_dim)) return std::nullopt;
      return Partial(ReduceOp::Max);
    case Combine::Min:
      if (has_empty_piece(spec, tensor_dim)) return std::nullopt;
      return Partial(ReduceOp::Min);
    case Combine::Gather:
      return std::nullopt;
  }
  return std::nullopt;
}

RuleResult reduction(const OpMeta& op, const ReductionArgs& ra) {
  const ShardTensorSpec& in = op.inputs.front().spec;
  const int64_t ndim = in.ndim();
  const std::vector<int64_t> dims =
      ra.dims_arg < 0 ? reduction_dims(c10::IValue(), ndim, op) : reduction_dims(op.args[ra.dims_arg], ndim, op);
  const bool keepdim = ra.keepdim_arg >= 0 && bool_arg(op, ra.keepdim_arg);
  auto reduced = [&](int64_t d) { return std::find(dims.begin(), dims.end(), d) != dims.end(); };
  const bool linear = ra.combine == Combine::Sum || ra.combine == Combine::Mean;

  Placements in_ps = in.placements();
  Placements out_ps = in_ps;
  bool partial_over_sharded = false;
  for (size_t m = 0; m < in_ps.size(); ++m) {
    const Placement& p = in_ps[m];
    if (p.is_partial() && !(linear && p.reduce_op == ReduceOp::Sum)) in_ps[m] = out_ps[m] = Replicate();
    if (!p.is_shard() || !reduced(p.tensor_dim)) continue;
    if (std::optional<Placement> partial = partial_for(ra.combine, in, p.tensor_dim)) {
      out_ps[m] = *partial;
      partial_over_sharded = true;
    } else {
      in_ps[m] = out_ps[m] = Replicate();
    }
  }
  const ShardTensorSpec target = with_placements(in, in_ps);

  // Output dims: reduced dims vanish unless kept; the remaining sharded dims renumber.
  std::vector<int64_t> dim_map(ndim);
  int64_t next = 0;
  for (int64_t d = 0; d < ndim; ++d) dim_map[d] = (keepdim || !reduced(d)) ? next++ : -1;
  OutputLayout out{out_ps, {}};
  for (Placement& p : out.placements)
    if (p.is_shard()) p.tensor_dim = dim_map[p.tensor_dim];
  for (const DimSharding& s : target.shardings())
    if (!reduced(s.tensor_dim)) out.sizes.push_back({dim_map[s.tensor_dim], s.sizes});

  RuleResult r;
  r.input_targets.push_back(target);
  r.outputs.push_back(out);
  if (op.schema->returns().size() == 2) r.outputs.push_back(out);  // max.dim / min.dim indices
  if (ra.combine == Combine::Mean && partial_over_sharded) {
    int64_t count = 1;
    for (int64_t d : dims) count *= in.shape()[d];
    r.kernel_plan = declare(GlobalMeanPlan(dims, count));
  }
  return r;
}

Rule reduce(ReductionArgs ra) {
  return [ra](const OpMeta& op) { return reduction(op, ra); };
}

}  // namespace

void register_reduction_rules(RuleRegistry& registry) {
  registry.add("aten::sum", reduce({-1, -1, Combine::Sum}));
  registry.add("aten::sum.dim_IntList", reduce({1, 2, Combine::Sum}));
  registry.add("aten::mean", reduce({-1, -1, Combine::Mean}));
  registry.add("aten::mean.dim", reduce({1, 2, Combine::Mean}));
  registry.add("aten::prod", reduce({-1, -1, Combine::Product}));
  registry.add("aten::prod.dim_int", reduce({1, 2, Combine::Product}));
  registry.add("aten::amax", reduce({1, 2, Combine::Max}));
  registry.add("aten::amin", reduce({1, 2, Combine::Min}));
  registry.add("aten::max", reduce({-1, -1, Combine::Max}));
  registry.add("aten::min", reduce({-1, -1, Combine::Min}));
  registry.add("aten::max.dim", reduce({1, 2, Combine::Gather}));
  registry.add("aten::min.dim", reduce({1, 2, Combine::Gather}));
  registry.add("aten::argmax", reduce({1, 2, Combine::Gather}));
  registry.add("aten::argmin", reduce({1, 2, Combine::Gather}));
  registry.add("aten::var.correction", reduce({1, 3, Combine::Gather}));
  registry.add("aten::std.correction", reduce({1, 3, Combine::Gather}));
  registry.add("aten::all", reduce({-1, -1, Combine::Gather}));
  registry.add("aten::any", reduce({-1, -1, Combine::Gather}));
  registry.add("aten::all.dim", reduce({1, 2, Combine::Gather}));
  registry.add("aten::any.dim", reduce({1, 2, Combine::Gather}));
  registry.add("aten::logsumexp", reduce({1, 2, Combine::Gather}));
  registry.add("aten::norm.ScalarOpt_dim", reduce({2, 3, Combine::Gather}));
  registry.add("aten::linalg_vector_norm", reduce({2, 3, Combine::Gather}));
}

}  // namespace shardtensor
