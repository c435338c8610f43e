// Matrix products: mm, bmm, mv, dot, addmm, baddbmm (and through them matmul and linear,
// which decompose above the dispatcher), and linear on 2-D operands where autograd does not
// record it (one operator instead of t + addmm; see linear_rule).
//
// Each op is an einsum over labels (mm: "ik,kj->ij"). Per mesh dim, the operands' placements
// must form one of these combinations:
//   R x R -> R;   S(batch) x S(batch) -> S(batch);   S(i) x R -> S(i);   R x S(j) -> S(j);
//   S(k) x S(k) -> P(sum)  (contraction);   P(r) x R -> P(r);   R x P(r) -> P(r)  (r: sum or avg).
// A product is linear in each operand, so a pending sum or average of one operand stays pending
// (mean_i(A_i) @ B == mean_i(A_i @ B)); P x P is not linear in the pair and resolves one side.
// When they do not, the rule picks the valid combination that moves the fewest bytes
// (R -> S is a free local slice; S -> R an all-gather; S -> S' an all-to-all; P -> R an
// all-reduce), preferring to keep the first operand's layout. Operands sharded on the same
// label get the same shard sizes, so misaligned uneven boundaries are realigned first.
#include <limits>

#include "rules/helpers.h"
#include "rules/contribution.h"

namespace shardtensor {
namespace {

struct Einsum {
  std::string a, b, out;
};

// Bytes-moved estimate (in elements) of changing one mesh dim's placement of `spec`.
double move_cost(const ShardTensorSpec& spec, const Placement& from, const Placement& to, int64_t group) {
  if (from == to || (from.is_replicate() && to.is_shard())) return 0;
  double numel = 1;
  for (int64_t s : spec.shape()) numel *= static_cast<double>(s);
  if (from.is_partial()) return to.is_partial() ? std::numeric_limits<double>::infinity() : 2 * numel;
  if (to.is_partial()) return std::numeric_limits<double>::infinity();  // R/S -> P is never asked of an operand
  if (from.is_shard() && to.is_replicate()) return numel * (group - 1) / group;
  return numel / group;  // S(a) -> S(b)
}

// The output placement of a combination, or nullopt when it is not valid.
std::optional<Placement> combine(const Einsum& e, const Placement& pa, const Placement& pb) {
  auto label = [](const std::string& labels, const Placement& p) { return p.is_shard() ? labels[p.tensor_dim] : '\0'; };
  const char la = label(e.a, pa), lb = label(e.b, pb);
  auto out_dim = [&](char l) { return static_cast<int64_t>(e.out.find(l)); };
  if (pa.is_partial() || pb.is_partial()) {
    const Placement& partial = pa.is_partial() ? pa : pb;
    const Placement& other = pa.is_partial() ? pb : pa;
    if (is_sum_or_avg(partial.reduce_op) && other.is_replicate()) return partial;
    return std::nullopt;
  }
  if (pa.is_replicate() && pb.is_replicate()) return Replicate();
  // A shard keeps its order into the output (a zigzag sequence stays one); a label split on
  // both sides must be split in one order.
  if (la && lb) {
    if (la != lb || pa.order != pb.order || pa.zigzag_unit != pb.zigzag_unit) return std::nullopt;
    if (e.out.find(la) == std::string::npos) return Partial(ReduceOp::Sum);  // contraction
    return moved_to_dim(pa, out_dim(la));                                    // batch
  }
  const char l = la ? la : lb;
  const std::string& other_labels = la ? e.b : e.a;
  if (other_labels.find(l) != std::string::npos) return std::nullopt;  // shared label, only one side sharded
  return moved_to_dim(la ? pa : pb, out_dim(l));
}

struct Choice {
  Placement a, b, out;
};

Choice choose(const Einsum& e, const ShardTensorSpec& a, const ShardTensorSpec& b, int64_t m) {
  const Placement& pa = a.placements()[m];
  const Placement& pb = b.placements()[m];
  std::vector<Placement> options_a = {pa, Replicate()}, options_b = {pb, Replicate()};
  for (int64_t d = 0; d < a.ndim(); ++d) options_a.push_back(Shard(d));
  for (int64_t d = 0; d < b.ndim(); ++d) options_b.push_back(Shard(d));
  const int64_t group = a.mesh().size(m);
  Choice best{Replicate(), Replicate(), Replicate()};
  double best_cost = std::numeric_limits<double>::infinity();
  for (const Placement& qa : options_a)
    for (const Placement& qb : options_b) {
      std::optional<Placement> out = combine(e, qa, qb);
      if (!out) continue;
      const double cost = move_cost(a, pa, qa, group) + move_cost(b, pb, qb, group);
      if (cost < best_cost) best_cost = cost, best = {qa, qb, *out};
    }
  return best;
}

struct Product {
  ShardTensorSpec a, b;
  OutputLayout out;
  std::vector<int64_t> summed_mesh_dims;  // where the output is Partial(sum): a bias joins once
};

Product plan_product(const Einsum& e, const ShardTensorSpec& a, const ShardTensorSpec& b) {
  const int64_t mesh_ndim = a.mesh().ndim();
  Placements qa(mesh_ndim), qb(mesh_ndim), out(mesh_ndim);
  std::vector<int64_t> summed_dims;
  for (int64_t m = 0; m < mesh_ndim; ++m) {
    const Choice c = choose(e, a, b, m);
    qa[m] = c.a, qb[m] = c.b, out[m] = c.out;
    if (c.out.is_partial() && c.out.reduce_op == ReduceOp::Sum) summed_dims.push_back(m);
  }
  ShardTensorSpec ta = with_placements(a, qa);
  ShardTensorSpec tb = with_placements(b, qb);
  // Same label sharded on both sides: one side takes the other's shard sizes. A side that was
  // Replicate is cut to its partner's split (a local slice, whatever the sizes); otherwise b
  // follows a, and realigning b is an all-to-all.
  const auto kept_its_split = [](const ShardTensorSpec& before, const ShardTensorSpec& after, int64_t dim) {
    const DimSharding* was = before.sharding_of(dim);
    const DimSharding* is = after.sharding_of(dim);
    return was && is && was->mesh_dims == is->mesh_dims;
  };
  const std::vector<DimSharding> a_shardings = ta.shardings();
  for (const DimSharding& s : a_shardings) {
    const size_t found = e.b.find(e.a[s.tensor_dim]);
    const int64_t in_b = static_cast<int64_t>(found);
    if (found == std::string::npos || !tb.sharding_of(in_b)) continue;
    if (!kept_its_split(a, ta, s.tensor_dim) && kept_its_split(b, tb, in_b))
      ta = with_dim_sizes(ta, s.tensor_dim, tb.sharding_of(in_b)->sizes);
    else
      tb = with_dim_sizes(tb, in_b, s.sizes);
  }
  OutputLayout layout{out, {}};
  for (int64_t d = 0; d < static_cast<int64_t>(e.out.size()); ++d) {
    const size_t in_a = e.a.find(e.out[d]);
    const DimSharding* s = in_a != std::string::npos ? ta.sharding_of(static_cast<int64_t>(in_a))
                                                     : tb.sharding_of(static_cast<int64_t>(e.b.find(e.out[d])));
    if (s) layout.sizes.push_back({d, s->sizes});
  }
  return {ta, tb, layout, summed_dims};
}

RuleResult product(const OpMeta& op, const Einsum& e) {
  Product p = plan_product(e, op.inputs[0].spec, op.inputs[1].spec);
  RuleResult r;
  r.input_targets = {p.a, p.b};
  r.outputs = {p.out};
  return r;
}

// The bias of addmm/baddbmm: laid out like the product where it has the dim, Replicate where
// it broadcasts. Where the product is Partial(sum), the bias is contributed once (see
// rules/contribution.h), or it would count once per term. Where it is Partial(avg), every term
// adds it: mean_i(bias + A_i @ B) == bias + mean_i(A_i @ B).
struct BiasedProduct {
  Product product;
  ShardTensorSpec bias;
};

BiasedProduct plan_biased_product(const Einsum& e, const ShardTensorSpec& bias, const ShardTensorSpec& a, const ShardTensorSpec& b) {
  Product p = plan_product(e, a, b);
  const int64_t offset = static_cast<int64_t>(e.out.size()) - bias.ndim();
  Placements qbias(bias.mesh().ndim(), Replicate());
  for (size_t m = 0; m < qbias.size(); ++m) {
    const Placement& o = p.out.placements[m];
    if (o.is_shard() && o.tensor_dim - offset >= 0 && bias.shape()[o.tensor_dim - offset] > 1) qbias[m] = moved_to_dim(o, o.tensor_dim - offset);
  }
  ShardTensorSpec tbias = with_placements(bias, qbias);
  for (const DimShardSizes& table : p.out.sizes)
    if (tbias.sharding_of(table.tensor_dim - offset)) tbias = with_dim_sizes(tbias, table.tensor_dim - offset, table.sizes);
  return {std::move(p), std::move(tbias)};
}

// The kernel plan of a product whose bias (argument `bias_arg`) joins a Partial(sum) result.
std::shared_ptr<const KernelPlan> bias_contributed_once(const Product& p, const ShardTensorSpec& bias, size_t bias_arg) {
  if (p.summed_mesh_dims.empty()) return nullptr;
  return declare(ContributedOncePlan(bias.mesh(), {{bias_arg, p.summed_mesh_dims}}));
}

RuleResult product_with_bias(const OpMeta& op, const Einsum& e) {
  const ShardTensorSpec& bias = op.inputs[0].spec;
  BiasedProduct bp = plan_biased_product(e, bias, op.inputs[1].spec, op.inputs[2].spec);
  RuleResult r;
  r.input_targets = {bp.bias, bp.product.a, bp.product.b};
  r.outputs = {bp.product.out};
  r.kernel_plan = bias_contributed_once(bp.product, bias, op.arg_index("self"));
  return r;
}

// A 2-D spec with its dims swapped: the layout t() gives, which moves nothing.
ShardTensorSpec transposed(const ShardTensorSpec& spec) {
  Placements placements = spec.placements();
  for (Placement& p : placements)
    if (p.is_shard()) p.tensor_dim = 1 - p.tensor_dim;
  ShardSizes sizes = spec.shard_sizes();
  for (DimShardSizes& table : sizes) table.tensor_dim = 1 - table.tensor_dim;
  return ShardTensorSpec(spec.mesh(), placements, {spec.shape()[1], spec.shape()[0]}, spec.dtype(), sizes);
}

// linear(input, weight, bias) with a 2-D input and weight, as one operator: the layouts of
// libtorch's own decomposition, addmm(bias, input, weight.t()) (mm(input, weight.t()) without a
// bias), computed on weight.t()'s layout. So a call that autograd records (through the
// decomposition) and one it does not (dispatch/direct_kernel.h) lay their result out alike.
RuleResult linear_rule(const OpMeta& op) {
  const ShardTensorSpec& input = op.input_named("input")->spec;
  const ShardTensorSpec& weight = op.input_named("weight")->spec;
  if (input.ndim() != 2 || weight.ndim() != 2)
    return RuleResult::unsupported("the linear rule takes a 2-D input and weight (others decompose), got " +
                                   std::to_string(input.ndim()) + "-D and " + std::to_string(weight.ndim()) + "-D");
  const Einsum mm{"ik", "kj", "ij"};
  RuleResult r;
  if (const TensorInput* bias = op.input_named("bias")) {
    BiasedProduct bp = plan_biased_product(mm, bias->spec, input, transposed(weight));
    r.input_targets = {bp.product.a, transposed(bp.product.b), bp.bias};
    r.outputs = {bp.product.out};
    r.kernel_plan = bias_contributed_once(bp.product, bias->spec, bias->arg_index);
  } else {
    Product p = plan_product(mm, input, transposed(weight));
    r.input_targets = {p.a, transposed(p.b)};
    r.outputs = {p.out};
  }
  return r;
}

Rule einsum(Einsum e) {
  return [e](const OpMeta& op) { return product(op, e); };
}

Rule einsum_with_bias(Einsum e) {
  return [e](const OpMeta& op) { return product_with_bias(op, e); };
}

}  // namespace

void register_matmul_rules(RuleRegistry& registry) {
  registry.add("aten::mm", einsum({"ik", "kj", "ij"}));
  registry.add("aten::bmm", einsum({"bik", "bkj", "bij"}));
  registry.add("aten::mv", einsum({"ik", "k", "i"}));
  registry.add("aten::dot", einsum({"k", "k", ""}));
  registry.add("aten::addmm", einsum_with_bias({"ik", "kj", "ij"}));
  registry.add("aten::baddbmm", einsum_with_bias({"bik", "bkj", "bij"}));
  registry.add("aten::linear", linear_rule);
  // Output shards are the operands' own, order kept (combine above).
  for (const char* name : {"aten::mm", "aten::bmm", "aten::mv", "aten::dot", "aten::addmm", "aten::baddbmm", "aten::linear"})
    registry.carry_order(name);
}

}  // namespace shardtensor
