// Reductions: sum, mean, prod, amax/amin, max/min, argmax/argmin, var/std, norms, all/any,
// logsumexp; over some dims (keepdim either way) or all of them.
//
// Over an unsharded dim a reduction is local. Over a sharded dim it becomes Partial when the
// per-rank results combine by one collective: sum -> P(sum); mean -> P(sum) of local sums over
// the GLOBAL count (uneven shards make an average of averages wrong); prod -> P(product);
// amax/amin -> P(max/min), a rank with an empty piece holding the identity (EmptyExtremumPlan:
// libtorch refuses the max of an empty tensor). The others
// (indices, variances, logsumexp, boolean all/any) gather the reduced dims first. A p-norm
// becomes a pending norm of the local norms (NormPartial: P(norm p), or P(sum) for p = 0 and 1,
// P(max) / P(min) for +-inf: DTensor's _NormPartial), except a negative or infinite norm over a
// dim with an empty shard (libtorch refuses those of an empty tensor: no identity), which gathers.
// A Partial input passes through the reductions that distribute over it (passes_through):
// P(sum/avg) through sum and mean, P(max) through max and amax, P(min) through min and amin,
// P(norm p) through the p-norm (the norm of pending norms: clip_grad_norm_'s norm of norms).
#include <ATen/core/function_schema.h>

#include <algorithm>
#include <cmath>

#include "rules/helpers.h"
#include "rules/reduction.h"

namespace shardtensor {
namespace {

enum class Combine { Sum, Mean, Product, Max, Min, Norm, Gather };

// Which dims an overload reduces: every dim (sum, max, all...: no dim argument, never keeps
// dims), or those of its `dim` argument (int, int[1] or int?; empty or None: every dim), kept
// when its `keepdim` is set. Every overload with a `dim` has a `keepdim`, wherever it puts
// them (var.correction and the norms have other arguments in between).
enum class Over { AllDims, DimArg };

struct ReductionArgs {
  Over over;
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
    case Combine::Max:  // an empty piece holds the identity (EmptyExtremumPlan)
      return Partial(ReduceOp::Max);
    case Combine::Min:
      return Partial(ReduceOp::Min);
    case Combine::Norm:  // its order decides (NormPartial)
    case Combine::Gather:
      return std::nullopt;
  }
  return std::nullopt;
}

// Whether a Partial input stays so through the reduction: sums and means of pending sums or
// averages, the maximum of pending maxima, the minimum of pending minima, the product of pending
// products, the p-norm of pending p-norms (only a real pending norm: a P(sum) input may hold
// negative terms, whose 1-norm is no sum of theirs).
bool passes_through(Combine combine, const Placement& partial, double norm_order) {
  const ReduceOp r = partial.reduce_op;
  switch (combine) {
    case Combine::Sum:
    case Combine::Mean:
      return r == ReduceOp::Sum || r == ReduceOp::Avg;
    case Combine::Max:
      return r == ReduceOp::Max;
    case Combine::Min:
      return r == ReduceOp::Min;
    case Combine::Product:
      return r == ReduceOp::Product;
    case Combine::Norm:
      return r == ReduceOp::Norm && partial.norm_order == norm_order;
    case Combine::Gather:
      return false;
  }
  return false;
}

// The order of a norm: linalg_vector_norm's `ord`, the norm overloads' `p` (None: 2).
double norm_order_of(const OpMeta& op) {
  const c10::IValue& order = op.arg(op.has_arg("ord") ? "ord" : "p");
  return order.isNone() ? 2.0 : order.toScalar().toDouble();
}

RuleResult reduction(const OpMeta& op, const ReductionArgs& ra) {
  const ShardTensorSpec& in = op.inputs.front().spec;
  const int64_t ndim = in.ndim();
  const bool by_dim = ra.over == Over::DimArg;
  const std::vector<int64_t> dims = reduction_dims(by_dim ? op.arg("dim") : c10::IValue(), ndim, op);
  const bool keepdim = by_dim && bool_arg(op, "keepdim");
  auto reduced = [&](int64_t d) { return std::find(dims.begin(), dims.end(), d) != dims.end(); };

  Placements in_ps = in.placements();
  Placements out_ps = in_ps;
  bool partial_over_sharded = false;
  const double norm_order = ra.combine == Combine::Norm ? norm_order_of(op) : 0;
  for (size_t m = 0; m < in_ps.size(); ++m) {
    const Placement& p = in_ps[m];
    if (p.is_partial() && !passes_through(ra.combine, p, norm_order)) in_ps[m] = out_ps[m] = Replicate();
    if (!p.is_shard() || !reduced(p.tensor_dim)) continue;
    // libtorch refuses a negative or infinite norm of an empty piece (no identity): gathered.
    if (ra.combine == Combine::Norm && !((norm_order < 0 || std::isinf(norm_order)) && has_empty_piece(in, p.tensor_dim))) {
      out_ps[m] = NormPartial(norm_order);
    } else if (std::optional<Placement> partial = partial_for(ra.combine, in, p.tensor_dim)) {
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
  const bool extremum = ra.combine == Combine::Max || ra.combine == Combine::Min;
  bool empty_piece = false;
  for (const DimSharding& s : target.shardings())
    empty_piece = empty_piece || (reduced(s.tensor_dim) && has_empty_piece(target, s.tensor_dim));
  if (extremum && empty_piece) r.kernel_plan = declare(EmptyExtremumPlan(dims, keepdim, ra.combine == Combine::Max));
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
  // Every reduction carries the zigzag order: a reduced zigzag dim becomes a Partial, whose
  // reduction does not depend on the order, or is gathered in order (arg-reductions, whose
  // indices are positions); the dims kept keep their placements.
  const auto add = [&](const char* name, ReductionArgs ra) {
    registry.add(name, reduce(ra));
    registry.carry_order(name);
  };
  add("aten::sum", {Over::AllDims, Combine::Sum});
  add("aten::sum.dim_IntList", {Over::DimArg, Combine::Sum});
  add("aten::mean", {Over::AllDims, Combine::Mean});
  add("aten::mean.dim", {Over::DimArg, Combine::Mean});
  add("aten::prod", {Over::AllDims, Combine::Product});
  add("aten::prod.dim_int", {Over::DimArg, Combine::Product});
  add("aten::amax", {Over::DimArg, Combine::Max});
  add("aten::amin", {Over::DimArg, Combine::Min});
  add("aten::max", {Over::AllDims, Combine::Max});
  add("aten::min", {Over::AllDims, Combine::Min});
  add("aten::max.dim", {Over::DimArg, Combine::Gather});
  add("aten::min.dim", {Over::DimArg, Combine::Gather});
  add("aten::argmax", {Over::DimArg, Combine::Gather});
  add("aten::argmin", {Over::DimArg, Combine::Gather});
  add("aten::var.correction", {Over::DimArg, Combine::Gather});
  add("aten::std.correction", {Over::DimArg, Combine::Gather});
  add("aten::all", {Over::AllDims, Combine::Gather});
  add("aten::any", {Over::AllDims, Combine::Gather});
  add("aten::all.dim", {Over::DimArg, Combine::Gather});
  add("aten::any.dim", {Over::DimArg, Combine::Gather});
  add("aten::logsumexp", {Over::DimArg, Combine::Gather});
  // Order statistics read the reduced dims whole (values and indices); the other dims keep
  // their shards.
  for (const char* name : {"aten::median.dim", "aten::nanmedian.dim", "aten::mode", "aten::kthvalue"})
    add(name, {Over::DimArg, Combine::Gather});
  for (const char* name : {"aten::median", "aten::nanmedian"}) add(name, {Over::AllDims, Combine::Gather});
  add("aten::any.dims", {Over::DimArg, Combine::Gather});
  add("aten::var_mean.correction", {Over::DimArg, Combine::Gather});
  for (const char* name : {"aten::norm.Scalar", "aten::norm.ScalarOpt_dtype"}) add(name, {Over::AllDims, Combine::Norm});
  for (const char* name : {"aten::norm.ScalarOpt_dim", "aten::norm.ScalarOpt_dim_dtype", "aten::linalg_vector_norm"})
    add(name, {Over::DimArg, Combine::Norm});
}

}  // namespace shardtensor
