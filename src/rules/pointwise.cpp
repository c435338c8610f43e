// Pointwise operators: unary, binary, ternary, comparisons, where/masked_fill, conversions,
// copies, fills and the backward kernels of pointwise activations.
//
// Pointwise ops read same-index elements, so any layout works when every operand shares it.
// The output follows a lead operand (for in-place ops, self; otherwise the full-shape operand
// sharded on the most mesh dims); every other operand is brought to the lead's layout,
// including its shard sizes, so operands with misaligned uneven boundaries are never combined
// piece by piece. Dims an operand broadcasts (missing, or size 1 against a larger size) are
// Replicate in that operand. See Note [Partial through pointwise] for when Partial survives.
#include "rules/helpers.h"

#include <algorithm>

namespace shardtensor {
namespace {

// Note [Partial through pointwise]
// A Partial(sum) operand is a pending sum of per-rank terms. An op keeps it pending only when
// it distributes over that sum: linear unary ops (neg, mul or div by a number), add/sub when
// every operand is Partial(sum) on that mesh dim, and mul/div when exactly the numerator side
// is Partial(sum) and the rest is Replicate there. Anything else resolves the Partial first.
enum class PartialPolicy { Resolve, LinearUnary, AddLike, MulLike, DivLike };

std::vector<int64_t> broadcast_shape(const OpMeta& op) {
  std::vector<int64_t> out;
  for (const TensorInput& in : op.inputs) {
    const std::vector<int64_t>& s = in.spec.shape();
    if (s.size() > out.size()) out.insert(out.begin(), s.size() - out.size(), 1);
    const size_t off = out.size() - s.size();
    for (size_t d = 0; d < s.size(); ++d)
      if (out[off + d] == 1) out[off + d] = s[d];
  }
  return out;
}

bool keeps_partial(const OpMeta& op, PartialPolicy policy, int64_t mesh_dim) {
  auto is_sum_partial = [&](const TensorInput& in) {
    const Placement& p = in.spec.placements()[mesh_dim];
    return p.is_partial() && p.reduce_op == ReduceOp::Sum;
  };
  auto is_replicate = [&](const TensorInput& in) { return in.spec.placements()[mesh_dim].is_replicate(); };
  const auto& ins = op.inputs;
  switch (policy) {
    case PartialPolicy::Resolve:
      return false;
    case PartialPolicy::LinearUnary:
      return ins.size() == 1 && is_sum_partial(ins[0]);
    case PartialPolicy::AddLike:
      return ins.size() >= 2 && std::all_of(ins.begin(), ins.end(), is_sum_partial);
    case PartialPolicy::MulLike:
      return std::count_if(ins.begin(), ins.end(), is_sum_partial) == 1 &&
             std::count_if(ins.begin(), ins.end(), is_replicate) == static_cast<long>(ins.size()) - 1;
    case PartialPolicy::DivLike:
      return is_sum_partial(ins[0]) && std::all_of(ins.begin() + 1, ins.end(), is_replicate);
  }
  return false;
}

int64_t count_shards(const ShardTensorSpec& spec) {
  return std::count_if(spec.placements().begin(), spec.placements().end(), [](const Placement& p) { return p.is_shard(); });
}

RuleResult pointwise(const OpMeta& op, PartialPolicy policy) {
  const std::vector<int64_t> out_shape = op.is_inplace() ? op.inputs.front().spec.shape() : broadcast_shape(op);
  const int64_t out_ndim = static_cast<int64_t>(out_shape.size());
  auto offset_of = [&](const TensorInput& in) { return out_ndim - in.spec.ndim(); };
  auto is_full_dim = [&](const TensorInput& in, int64_t d) { return in.spec.shape()[d] == out_shape[d + offset_of(in)]; };

  // The lead: self for in-place ops, else the full-shape operand with the most sharded mesh dims.
  size_t lead = 0;
  if (!op.is_inplace()) {
    int64_t best = -1;
    for (size_t i = 0; i < op.inputs.size(); ++i) {
      const TensorInput& in = op.inputs[i];
      if (in.spec.shape() != out_shape) continue;
      if (count_shards(in.spec) > best) best = count_shards(in.spec), lead = i;
    }
  }
  const TensorInput& lead_in = op.inputs[lead];

  // Output placements: the lead's, minus broadcast dims and unsupported Partials.
  const int64_t mesh_ndim = op.mesh().ndim();
  Placements out_ps(mesh_ndim, Replicate());
  for (int64_t m = 0; m < mesh_ndim; ++m) {
    const Placement& p = lead_in.spec.placements()[m];
    if (p.is_shard() && is_full_dim(lead_in, p.tensor_dim)) out_ps[m] = Shard(p.tensor_dim + offset_of(lead_in));
    if (p.is_partial() && keeps_partial(op, policy, m)) out_ps[m] = p;
  }
  // The lead's target fixes the size tables every operand follows.
  Placements lead_ps(mesh_ndim);
  for (int64_t m = 0; m < mesh_ndim; ++m)
    lead_ps[m] = out_ps[m].is_shard() ? Shard(out_ps[m].tensor_dim - offset_of(lead_in)) : out_ps[m];
  const ShardTensorSpec lead_target = with_placements(lead_in.spec, lead_ps);

  RuleResult r;
  OutputLayout out{out_ps, {}};
  for (const DimSharding& s : lead_target.shardings()) out.sizes.push_back({s.tensor_dim + offset_of(lead_in), s.sizes});

  for (size_t i = 0; i < op.inputs.size(); ++i) {
    const TensorInput& in = op.inputs[i];
    if (i == lead) {
      r.input_targets.push_back(lead_target);
      continue;
    }
    Placements ps(mesh_ndim, Replicate());
    for (int64_t m = 0; m < mesh_ndim; ++m) {
      const Placement& o = out_ps[m];
      const int64_t d = o.is_shard() ? o.tensor_dim - offset_of(in) : -1;
      if (o.is_shard() && d >= 0 && is_full_dim(in, d)) ps[m] = Shard(d);
      if (o.is_partial() && in.spec.placements()[m].is_partial()) ps[m] = o;
    }
    ShardTensorSpec target = with_placements(in.spec, ps);
    for (const DimShardSizes& table : out.sizes)
      if (target.sharding_of(table.tensor_dim - offset_of(in))) target = with_dim_sizes(target, table.tensor_dim - offset_of(in), table.sizes);
    r.input_targets.push_back(target);
  }
  r.outputs.push_back(std::move(out));
  return r;
}

Rule with_policy(PartialPolicy policy) {
  return [policy](const OpMeta& op) { return pointwise(op, policy); };
}

// Fresh values shaped like the input (zeros_like, ones_like, ...): the input's layout, but a
// pending reduction of fresh values would count them once per term, so Partial becomes Replicate.
RuleResult like_factory(const OpMeta& op) {
  RuleResult r;
  const ShardTensorSpec& in = op.inputs.front().spec;
  r.input_targets.push_back(in);
  r.outputs.push_back(layout_of(without_partial(in)));
  return r;
}

const char* const kUnaryOps[] = {
    "abs", "neg", "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sin", "cos", "tan", "asin", "acos",
    "atan", "sinh", "cosh", "tanh", "sigmoid", "relu", "sqrt", "rsqrt", "reciprocal", "sign", "floor", "ceil",
    "round", "trunc", "frac", "erf", "erfc", "logical_not", "bitwise_not", "silu", "mish", "hardsigmoid",
    "hardswish"};

// Activation forms that take extra scalar arguments: still one tensor, still elementwise.
const char* const kUnaryWithArgs[] = {
    "aten::gelu", "aten::gelu_", "aten::leaky_relu", "aten::leaky_relu_", "aten::elu", "aten::elu_",
    "aten::hardtanh", "aten::hardtanh_", "aten::softplus", "aten::threshold", "aten::threshold_",
    "aten::clamp", "aten::clamp_", "aten::clamp_min", "aten::clamp_min_", "aten::clamp_max", "aten::clamp_max_",
    "aten::pow.Tensor_Scalar", "aten::pow_.Scalar", "aten::nan_to_num", "aten::nan_to_num_", "aten::isnan",
    "aten::add.Scalar", "aten::sub.Scalar", "aten::add_.Scalar", "aten::sub_.Scalar", "aten::rsub.Scalar",
    "aten::eq.Scalar", "aten::ne.Scalar", "aten::lt.Scalar", "aten::le.Scalar", "aten::gt.Scalar", "aten::ge.Scalar",
    "aten::_to_copy", "aten::masked_fill.Scalar", "aten::masked_fill_.Scalar", "aten::remainder.Scalar",
    "aten::remainder_.Scalar", "aten::fmod.Scalar", "aten::fmod_.Scalar"};

const char* const kLinearUnaryOps[] = {"aten::neg", "aten::neg_", "aten::clone", "aten::mul.Scalar", "aten::mul_.Scalar",
                                       "aten::div.Scalar", "aten::div_.Scalar"};

const char* const kBinaryOps[] = {
    "aten::pow.Tensor_Tensor", "aten::maximum", "aten::minimum", "aten::eq.Tensor", "aten::ne.Tensor", "aten::lt.Tensor",
    "aten::le.Tensor", "aten::gt.Tensor", "aten::ge.Tensor", "aten::logical_and", "aten::logical_or",
    "aten::where.self", "aten::masked_fill.Tensor", "aten::masked_fill_.Tensor", "aten::addcmul", "aten::addcmul_",
    "aten::addcdiv", "aten::addcdiv_", "aten::lerp.Scalar", "aten::lerp_.Scalar", "aten::rsub.Tensor",
    "aten::threshold_backward", "aten::sigmoid_backward", "aten::tanh_backward", "aten::gelu_backward",
    "aten::leaky_relu_backward", "aten::hardtanh_backward", "aten::elu_backward",
    "aten::copy_", "aten::div.Tensor_mode", "aten::logical_and_", "aten::logical_or_", "aten::hardsigmoid_backward",
    "aten::hardswish_backward", "aten::softplus_backward", "aten::sgn", "aten::sgn_", "aten::remainder.Tensor",
    "aten::remainder_.Tensor", "aten::fmod.Tensor", "aten::fmod_.Tensor"};

}  // namespace

void register_pointwise_rules(RuleRegistry& registry) {
  const Rule resolve = with_policy(PartialPolicy::Resolve);
  for (const char* base : kUnaryOps) {
    registry.add(std::string("aten::") + base, resolve);
    registry.add(std::string("aten::") + base + "_", resolve);
  }
  for (const char* name : kUnaryWithArgs) registry.add(name, resolve);
  for (const char* name : kBinaryOps) registry.add(name, resolve);
  for (const char* name : kLinearUnaryOps) registry.add(name, with_policy(PartialPolicy::LinearUnary));
  for (const char* name : {"aten::add.Tensor", "aten::add_.Tensor", "aten::sub.Tensor", "aten::sub_.Tensor"})
    registry.add(name, with_policy(PartialPolicy::AddLike));
  for (const char* name : {"aten::mul.Tensor", "aten::mul_.Tensor"}) registry.add(name, with_policy(PartialPolicy::MulLike));
  for (const char* name : {"aten::div.Tensor", "aten::div_.Tensor"})
    registry.add(name, with_policy(PartialPolicy::DivLike));
  for (const char* name : {"aten::zeros_like", "aten::ones_like", "aten::empty_like", "aten::full_like"})
    registry.add(name, like_factory);
  // Overwriting in place: self keeps its layout; a Partial self is resolved first, or every
  // term would hold the new value.
  for (const char* name : {"aten::fill_.Scalar", "aten::zero_", "aten::fill_.Tensor"}) registry.add(name, resolve);
  // Fresh tensors of a given size from a ShardTensor's options: Replicate, nothing moves.
  for (const char* name : {"aten::new_zeros", "aten::new_ones", "aten::new_empty", "aten::new_full", "aten::new_empty_strided"})
    registry.add(name, [](const OpMeta& op) {
      RuleResult r;
      r.input_targets = {op.inputs[0].spec};
      r.outputs = {replicated_layout(op.mesh())};
      return r;
    });
  // Results that depend on every value (.item(), nonzero): computed whole from gathered inputs,
  // identical on every rank, Replicate.
  for (const char* name : {"aten::_local_scalar_dense", "aten::nonzero"})
    registry.add(name, [](const OpMeta& op) {
      RuleResult r;
      r.input_targets = {replicated(op.inputs[0].spec)};
      r.outputs = {replicated_layout(op.mesh())};
      return r;
    });
}

}  // namespace shardtensor
