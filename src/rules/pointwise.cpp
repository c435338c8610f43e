// Pointwise operators: unary, binary, ternary, comparisons, where/masked_fill, conversions,
// copies, fills and the backward kernels of pointwise activations.
//
// Pointwise ops read same-index elements, so any layout works when every operand shares it.
// The output follows a lead operand (for in-place ops, self; otherwise the full-shape operand
// sharded on the most mesh dims); every other operand is brought to the lead's layout,
// including its shard sizes, so operands with misaligned uneven boundaries are never combined
// piece by piece. Dims an operand broadcasts (missing, or size 1 against a larger size) are
// Replicate in that operand. See Note [Partial through pointwise] for when Partial survives.
#include "rules/contribution.h"
#include "rules/helpers.h"
#include "rules/views.h"
#include "util/strings.h"

#include <c10/util/strides.h>

#include <algorithm>

namespace shardtensor {
namespace {

// Note [Partial through pointwise]
// A Partial operand is a pending reduction of one term per rank. An op keeps it pending only
// where the op distributes over that reduction, as DTensor's strategies do:
//   - LinearUnary (neg, clone, scaling by a number): P(sum), P(avg);
//   - NonDecreasing (relu, exp, clamp, floor...): f(max_i a_i) = max_i f(a_i): P(max), P(min);
//   - Additive (add, sub; rsub negates self): operands that are all P(sum) or all P(avg) stay
//     so; a Replicate operand joins P(avg) as is, and P(sum) once (rules/contribution.h); a
//     P(max/min) self stays so when a Replicate value is added to it;
//   - Product (mul): one P(sum/avg) operand times Replicate ones. Of two Partial operands only
//     one is reduced, so a product of pending sums costs one reduction, not two;
//   - Quotient (div): a P(sum/avg) numerator over Replicate denominators;
//   - Lattice (maximum/minimum): max_i a_i vs b = max_i (a_i vs b), for any Partial(max/min) a
//     and Replicate b, and for all-P(max) operands of maximum (all-P(min) of minimum);
//   - Select (where, masked_fill) and Overwrite (copy_, fill_): each output element is one of
//     the values, so every Partial kind survives; Replicate values (tensors and scalars) join
//     P(sum) once, and selectors (condition, mask) are never Partial;
//   - AnyPartial (zero_): terms that are all zero reduce to zero under every kind.
// Anything else resolves the Partial first. An in-place op keeps self's placement: a Partial
// self that the op cannot keep is resolved, computed on, and partitioned back (kernel.cpp).
enum class PartialPolicy {
  Resolve, AnyPartial, LinearUnary, NonDecreasing, Additive, NegatedSelf, Product, Quotient, LatticeMax,
  LatticeMin, Select, Overwrite
};

std::string describe_inputs(const OpMeta& op) {
  std::vector<std::string> parts;
  for (const TensorInput& in : op.inputs)
    parts.push_back("'" + arg_name(op, in) + "'" + (in.plain ? " (plain) " : " ") + in.spec.to_string());
  return join(parts, ", ");
}

// The inputs' global shapes broadcast together, checked: the local pieces alone would hide a
// mismatch (a plain tensor of a piece's shape next to a ShardTensor of the whole one).
std::vector<int64_t> broadcast_shape(const OpMeta& op) {
  std::vector<int64_t> out;
  for (const TensorInput& in : op.inputs) {
    const std::vector<int64_t>& s = in.spec.shape();
    if (s.size() > out.size()) out.insert(out.begin(), s.size() - out.size(), 1);
    const size_t off = out.size() - s.size();
    for (size_t d = 0; d < s.size(); ++d) {
      TORCH_CHECK(out[off + d] == s[d] || out[off + d] == 1 || s[d] == 1, op.name, ": the global shapes do not broadcast: ",
                  "argument '", arg_name(op, in), "' has size ", s[d], " at dim ", d, " where the other inputs have ",
                  out[off + d], " (inputs: ", describe_inputs(op), ").",
                  in.plain ? " A plain tensor counts as Replicate, i.e. as the whole tensor on every rank; a local "
                             "piece is not: wrap it with from_local()." : "");
      if (out[off + d] == 1) out[off + d] = s[d];
    }
  }
  return out;
}

// What one mesh dim's Partial placements become.
struct PartialOutcome {
  std::optional<Placement> out;  // the Partial the output keeps (none: no Partial survives)
  std::vector<bool> kept;        // per input: stays Partial (the others are resolved)
  bool contribute_once = false;  // P(sum) output: replicated values are contributed once
};

// Selectors pick elements; they are not values that could be pending.
bool is_selector(const OpMeta& op, const TensorInput& in) {
  const std::string& name = arg_name(op, in);
  return name == "condition" || name == "mask";
}

// The value operand written over by copy_ and fill_ is not read: self there is no value.
bool is_value(const OpMeta& op, PartialPolicy policy, size_t i) {
  if (is_selector(op, op.inputs[i])) return false;
  return !(policy == PartialPolicy::Overwrite && i == 0);
}

bool is_max_or_min(ReduceOp r) { return r == ReduceOp::Max || r == ReduceOp::Min; }

PartialOutcome partial_outcome(const OpMeta& op, PartialPolicy policy, int64_t m) {
  const auto& ins = op.inputs;
  PartialOutcome o;
  o.kept.assign(ins.size(), false);
  auto placement = [&](size_t i) -> const Placement& { return ins[i].spec.placements()[m]; };

  // The Partial the output would keep: self's for an in-place op (never another), else the
  // first Partial value's.
  std::optional<size_t> chosen;
  if (op.is_inplace()) {
    if (placement(0).is_partial()) chosen = 0;
  } else {
    for (size_t i = 0; i < ins.size() && !chosen; ++i)
      if (is_value(op, policy, i) && placement(i).is_partial()) chosen = i;
  }
  if (!chosen || policy == PartialPolicy::Resolve) return o;
  const Placement partial = placement(*chosen);
  const ReduceOp r = partial.reduce_op;
  auto keep_all_alike = [&] {
    for (size_t i = 0; i < ins.size(); ++i) o.kept[i] = (is_value(op, policy, i) || i == *chosen) && placement(i) == partial;
  };
  switch (policy) {
    case PartialPolicy::Resolve:
      return o;
    case PartialPolicy::AnyPartial:
      o.kept[*chosen] = true;
      break;
    case PartialPolicy::LinearUnary:
    case PartialPolicy::NonDecreasing:
      if (policy == PartialPolicy::LinearUnary ? !is_sum_or_avg(r) : !is_max_or_min(r)) return o;
      o.kept[*chosen] = true;
      break;
    case PartialPolicy::Additive:
    case PartialPolicy::NegatedSelf:
      if (is_sum_or_avg(r)) {
        keep_all_alike();
      } else if (policy == PartialPolicy::Additive && is_max_or_min(r) && arg_name(op, ins[*chosen]) == "self") {
        o.kept[*chosen] = true;  // a shift by a replicated value keeps the order
      } else {
        return o;
      }
      break;
    case PartialPolicy::Product: {
      if (!is_sum_or_avg(r)) return o;
      size_t keep = *chosen;  // in place: self; else the largest alike operand (the cheapest to leave pending)
      for (size_t i = 0; i < ins.size() && !op.is_inplace(); ++i)
        if (placement(i) == partial && numel_of(ins[i].spec) > numel_of(ins[keep].spec)) keep = i;
      o.kept[keep] = true;
      break;
    }
    case PartialPolicy::Quotient:
      if (!is_sum_or_avg(r) || arg_name(op, ins[*chosen]) != "self") return o;
      o.kept[*chosen] = true;
      break;
    case PartialPolicy::LatticeMax:
    case PartialPolicy::LatticeMin:
      if (!is_max_or_min(r)) return o;
      if (r == (policy == PartialPolicy::LatticeMax ? ReduceOp::Max : ReduceOp::Min)) {
        keep_all_alike();
      } else {
        o.kept[*chosen] = true;
      }
      break;
    case PartialPolicy::Select:
    case PartialPolicy::Overwrite:
      // A replicated value would count once per term of a product; a norm's terms are norms.
      if (r == ReduceOp::Product || r == ReduceOp::Norm) return o;
      keep_all_alike();
      break;
  }
  o.out = partial;
  o.contribute_once = r == ReduceOp::Sum && (policy == PartialPolicy::Additive || policy == PartialPolicy::NegatedSelf ||
                                              policy == PartialPolicy::Select || policy == PartialPolicy::Overwrite);
  return o;
}

// The schema positions of the replicated values a Partial(sum) output takes once: value
// operands left Replicate, and the scalar `other` of add.Scalar or `value` of fill_.
std::vector<size_t> replicated_values(const OpMeta& op, PartialPolicy policy, const std::vector<bool>& kept) {
  std::vector<size_t> args;
  for (size_t i = 0; i < op.inputs.size(); ++i)
    if (is_value(op, policy, i) && !kept[i]) args.push_back(op.inputs[i].arg_index);
  for (const char* name : {"other", "value"})
    if (op.has_arg(name) && op.arg(name).isScalar()) args.push_back(op.arg_index(name));
  return args;
}

int64_t count_shards(const ShardTensorSpec& spec) {
  return std::count_if(spec.placements().begin(), spec.placements().end(), [](const Placement& p) { return p.is_shard(); });
}

RuleResult pointwise(const OpMeta& op, PartialPolicy policy) {
  const std::vector<int64_t> broadcast = broadcast_shape(op);
  const std::vector<int64_t> out_shape = op.is_inplace() ? op.inputs.front().spec.shape() : broadcast;
  TORCH_CHECK(out_shape == broadcast, op.name, ": the in-place output has shape [", join(out_shape, ", "),
              "] but the inputs broadcast to [", join(broadcast, ", "), "] (inputs: ", describe_inputs(op), ")");
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

  // Output placements: the lead's shards, minus broadcast dims; Partials where they survive.
  const int64_t mesh_ndim = op.mesh().ndim();
  Placements out_ps(mesh_ndim, Replicate());
  std::vector<std::vector<bool>> kept(op.inputs.size(), std::vector<bool>(mesh_ndim, false));
  std::vector<ContributedValue> contributed;  // per replicated value, the P(sum) mesh dims it joins
  for (int64_t m = 0; m < mesh_ndim; ++m) {
    const Placement& p = lead_in.spec.placements()[m];
    if (p.is_shard()) {
      if (is_full_dim(lead_in, p.tensor_dim)) out_ps[m] = moved_to_dim(p, p.tensor_dim + offset_of(lead_in));
      continue;
    }
    const PartialOutcome o = partial_outcome(op, policy, m);
    if (!o.out) continue;
    out_ps[m] = *o.out;
    for (size_t i = 0; i < op.inputs.size(); ++i) kept[i][m] = o.kept[i];
    if (!o.contribute_once) continue;
    for (size_t arg : replicated_values(op, policy, o.kept)) {
      auto v = std::find_if(contributed.begin(), contributed.end(), [&](const ContributedValue& c) { return c.arg == arg; });
      if (v == contributed.end()) v = contributed.insert(contributed.end(), ContributedValue{arg, {}});
      v->mesh_dims.push_back(m);
    }
  }
  // Each operand's target: the output's shards where it has the dim in full, its own Partial
  // where kept, Replicate elsewhere. The lead's target fixes the size tables the rest follow.
  auto target_placements = [&](size_t i) {
    const TensorInput& in = op.inputs[i];
    Placements ps(mesh_ndim, Replicate());
    for (int64_t m = 0; m < mesh_ndim; ++m) {
      const Placement& o = out_ps[m];
      const int64_t d = o.is_shard() ? o.tensor_dim - offset_of(in) : -1;
      if (o.is_shard() && d >= 0 && is_full_dim(in, d)) ps[m] = moved_to_dim(o, d);
      if (kept[i][m]) ps[m] = in.spec.placements()[m];
    }
    return ps;
  };
  const ShardTensorSpec lead_target = with_placements(lead_in.spec, target_placements(lead));

  RuleResult r;
  OutputLayout out{out_ps, {}};
  for (const DimSharding& s : lead_target.shardings()) out.sizes.push_back({s.tensor_dim + offset_of(lead_in), s.sizes});

  for (size_t i = 0; i < op.inputs.size(); ++i) {
    const TensorInput& in = op.inputs[i];
    if (i == lead) {
      r.input_targets.push_back(lead_target);
      continue;
    }
    ShardTensorSpec target = with_placements(in.spec, target_placements(i));
    for (const DimShardSizes& table : out.sizes)
      if (target.sharding_of(table.tensor_dim - offset_of(in))) target = with_dim_sizes(target, table.tensor_dim - offset_of(in), table.sizes);
    r.input_targets.push_back(target);
  }
  r.outputs.push_back(std::move(out));
  if (!contributed.empty()) r.kernel_plan = declare(ContributedOncePlan(op.mesh(), std::move(contributed)));
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

// Fresh tensors of a given size from a ShardTensor's options (new_zeros, new_full...): of self's
// global shape, they are sharded like self, as DTensor's new_factory_strategy does, each rank
// making only its piece; of any other size (or strides that are not contiguous), Replicate.
// Nothing moves either way.
RuleResult new_factory(const OpMeta& op) {
  const ShardTensorSpec& self = op.inputs[0].spec;
  const std::vector<int64_t> size = int_list_arg(op, "size");
  const bool strided = op.has_arg("stride");
  const bool follows = size == self.shape() && !self.shardings().empty() &&
                       (!strided || c10::IntArrayRef(int_list_arg(op, "stride")) == c10::IntArrayRef(c10::contiguous_strides(size)));
  RuleResult r;
  r.input_targets = {self};
  if (!follows) {
    r.outputs = {replicated_layout(op.mesh())};
    return r;
  }
  const ShardTensorSpec layout = without_partial(self);  // fresh values are not a pending reduction
  r.outputs = {layout_of(layout)};
  std::vector<SizeFromInput> rewrites;
  for (const DimSharding& s : layout.shardings()) rewrites.push_back({s.tensor_dim, s.tensor_dim});
  r.kernel_plan = declare(LocalSizesPlan(op.arg_index("size"), op.inputs[0].arg_index, std::move(rewrites),
                                         strided ? std::optional<size_t>(op.arg_index("stride")) : std::nullopt));
  return r;
}

const char* const kUnaryOps[] = {
    "abs", "neg", "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sin", "cos", "tan", "asin", "acos",
    "atan", "sinh", "cosh", "tanh", "sigmoid", "relu", "sqrt", "rsqrt", "reciprocal", "sign", "floor", "ceil",
    "round", "trunc", "frac", "erf", "erfc", "erfinv", "logical_not", "bitwise_not", "silu", "mish", "hardsigmoid",
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

const char* const kBinaryOps[] = {
    "aten::pow.Tensor_Tensor", "aten::maximum", "aten::minimum", "aten::eq.Tensor", "aten::ne.Tensor", "aten::lt.Tensor",
    "aten::le.Tensor", "aten::gt.Tensor", "aten::ge.Tensor", "aten::logical_and", "aten::logical_or",
    "aten::where.self", "aten::masked_fill.Tensor", "aten::masked_fill_.Tensor", "aten::addcmul", "aten::addcmul_",
    "aten::addcdiv", "aten::addcdiv_", "aten::lerp.Scalar", "aten::lerp_.Scalar", "aten::rsub.Tensor",
    "aten::threshold_backward", "aten::sigmoid_backward", "aten::tanh_backward", "aten::gelu_backward",
    "aten::leaky_relu_backward", "aten::hardtanh_backward", "aten::elu_backward",
    "aten::copy_", "aten::div.Tensor_mode", "aten::logical_and_", "aten::logical_or_", "aten::hardsigmoid_backward",
    "aten::hardswish_backward", "aten::softplus_backward", "aten::sgn", "aten::sgn_", "aten::remainder.Tensor",
    "aten::remainder_.Tensor", "aten::fmod.Tensor", "aten::fmod_.Tensor", "aten::bitwise_and.Tensor",
    "aten::bitwise_and_.Tensor", "aten::bitwise_or.Tensor", "aten::bitwise_or_.Tensor", "aten::bitwise_xor.Tensor",
    "aten::bitwise_xor_.Tensor", "aten::logical_xor", "aten::logical_xor_"};

// Elementwise in every tensor operand, with DTensor's pointwise strategy in torch 2.15 (found by
// tests/python/test_operator_coverage.py): the special functions, bitwise and shift operators,
// scalar-first and in-place overloads of the comparisons and arithmetic, and activations. Each
// output element reads the same-index elements of the operands, so the general rule serves them.
// (Those that decompose above autograd, such as clip, square or float_power, reach their parts'
// rules and need none.)
const char* const kMoreElementwise[] = {
    "aten::__ilshift__.Scalar", "aten::__ilshift__.Tensor", "aten::__irshift__.Scalar", "aten::__irshift__.Tensor",
    "aten::__lshift__.Scalar", "aten::__lshift__.Tensor", "aten::__rshift__.Scalar", "aten::__rshift__.Tensor",
    "aten::acosh", "aten::acosh_", "aten::angle", "aten::asinh",
    "aten::asinh_", "aten::atan2", "aten::atan2_", "aten::atanh",
    "aten::atanh_", "aten::bitwise_and.Scalar", "aten::bitwise_and.Scalar_Tensor", "aten::bitwise_and_.Scalar",
    "aten::bitwise_left_shift.Scalar_Tensor", "aten::bitwise_left_shift.Tensor", "aten::bitwise_left_shift.Tensor_Scalar", "aten::bitwise_left_shift_.Tensor",
    "aten::bitwise_left_shift_.Tensor_Scalar", "aten::bitwise_or.Scalar", "aten::bitwise_or.Scalar_Tensor", "aten::bitwise_or_.Scalar",
    "aten::bitwise_right_shift.Scalar_Tensor", "aten::bitwise_right_shift.Tensor", "aten::bitwise_right_shift.Tensor_Scalar", "aten::bitwise_right_shift_.Tensor",
    "aten::bitwise_right_shift_.Tensor_Scalar", "aten::bitwise_xor.Scalar", "aten::bitwise_xor.Scalar_Tensor", "aten::bitwise_xor_.Scalar",
    "aten::celu", "aten::celu_", "aten::clamp.Tensor", "aten::clamp_.Tensor",
    "aten::clamp_max.Tensor", "aten::clamp_max_.Tensor", "aten::clamp_min.Tensor", "aten::clamp_min_.Tensor",
    "aten::copysign.Scalar", "aten::copysign.Tensor", "aten::copysign_.Scalar", "aten::copysign_.Tensor",
    "aten::deg2rad", "aten::deg2rad_", "aten::digamma", "aten::digamma_",
    "aten::div.Scalar_mode", "aten::div_.Scalar_mode", "aten::div_.Tensor_mode", "aten::eq_.Scalar",
    "aten::eq_.Tensor", "aten::fmax", "aten::fmin", "aten::gcd",
    "aten::gcd_", "aten::ge_.Scalar", "aten::ge_.Tensor", "aten::gt_.Scalar",
    "aten::gt_.Tensor", "aten::hardshrink", "aten::heaviside", "aten::heaviside_",
    "aten::hypot", "aten::hypot_", "aten::i0", "aten::i0_",
    "aten::igamma", "aten::igamma_", "aten::igammac", "aten::igammac_",
    "aten::isinf", "aten::isneginf", "aten::isposinf", "aten::lcm",
    "aten::lcm_", "aten::ldexp.Tensor", "aten::ldexp_", "aten::le_.Scalar",
    "aten::le_.Tensor", "aten::lerp.Tensor", "aten::lerp_.Tensor", "aten::lgamma",
    "aten::lgamma_", "aten::logaddexp", "aten::logaddexp2", "aten::logit",
    "aten::logit_", "aten::logit_backward", "aten::lt_.Scalar", "aten::lt_.Tensor",
    "aten::mvlgamma", "aten::mvlgamma_", "aten::ne_.Scalar", "aten::ne_.Tensor",
    "aten::nextafter", "aten::nextafter_", "aten::polygamma", "aten::polygamma_",
    "aten::pow.Scalar", "aten::pow_.Tensor", "aten::rad2deg", "aten::rad2deg_",
    "aten::remainder.Scalar_Tensor", "aten::round.decimals", "aten::round_.decimals", "aten::signbit",
    "aten::sinc", "aten::sinc_", "aten::softshrink", "aten::special_airy_ai",
    "aten::special_bessel_j0", "aten::special_bessel_j1", "aten::special_bessel_y0", "aten::special_bessel_y1",
    "aten::special_chebyshev_polynomial_t", "aten::special_chebyshev_polynomial_t.n_scalar", "aten::special_chebyshev_polynomial_t.x_scalar", "aten::special_chebyshev_polynomial_u",
    "aten::special_chebyshev_polynomial_u.n_scalar", "aten::special_chebyshev_polynomial_u.x_scalar", "aten::special_chebyshev_polynomial_v", "aten::special_chebyshev_polynomial_v.n_scalar",
    "aten::special_chebyshev_polynomial_v.x_scalar", "aten::special_chebyshev_polynomial_w", "aten::special_chebyshev_polynomial_w.n_scalar", "aten::special_chebyshev_polynomial_w.x_scalar",
    "aten::special_entr", "aten::special_erfcx", "aten::special_hermite_polynomial_h", "aten::special_hermite_polynomial_h.n_scalar",
    "aten::special_hermite_polynomial_h.x_scalar", "aten::special_hermite_polynomial_he", "aten::special_hermite_polynomial_he.n_scalar", "aten::special_hermite_polynomial_he.x_scalar",
    "aten::special_i0e", "aten::special_i1", "aten::special_i1e", "aten::special_laguerre_polynomial_l",
    "aten::special_laguerre_polynomial_l.n_scalar", "aten::special_laguerre_polynomial_l.x_scalar", "aten::special_legendre_polynomial_p", "aten::special_legendre_polynomial_p.n_scalar",
    "aten::special_legendre_polynomial_p.x_scalar", "aten::special_log_ndtr", "aten::special_modified_bessel_i0", "aten::special_modified_bessel_i1",
    "aten::special_modified_bessel_k0", "aten::special_modified_bessel_k1", "aten::special_ndtri", "aten::special_scaled_modified_bessel_k0",
    "aten::special_scaled_modified_bessel_k1", "aten::special_shifted_chebyshev_polynomial_t", "aten::special_shifted_chebyshev_polynomial_t.n_scalar", "aten::special_shifted_chebyshev_polynomial_t.x_scalar",
    "aten::special_shifted_chebyshev_polynomial_u", "aten::special_shifted_chebyshev_polynomial_u.n_scalar", "aten::special_shifted_chebyshev_polynomial_u.x_scalar", "aten::special_shifted_chebyshev_polynomial_v",
    "aten::special_shifted_chebyshev_polynomial_v.n_scalar", "aten::special_shifted_chebyshev_polynomial_v.x_scalar", "aten::special_shifted_chebyshev_polynomial_w", "aten::special_shifted_chebyshev_polynomial_w.n_scalar",
    "aten::special_shifted_chebyshev_polynomial_w.x_scalar", "aten::special_spherical_bessel_j0", "aten::special_xlog1py", "aten::special_xlog1py.other_scalar",
    "aten::special_xlog1py.self_scalar", "aten::special_zeta", "aten::special_zeta.other_scalar", "aten::special_zeta.self_scalar",
    "aten::xlogy.Scalar_Other", "aten::xlogy.Scalar_Self", "aten::xlogy.Tensor", "aten::xlogy_.Scalar_Other",
    "aten::xlogy_.Tensor",
};

}  // namespace

std::vector<std::string> more_elementwise_op_names() {
  return {std::begin(kMoreElementwise), std::end(kMoreElementwise)};
}

void register_pointwise_rules(RuleRegistry& registry) {
  const Rule resolve = with_policy(PartialPolicy::Resolve);
  for (const char* base : kUnaryOps) {
    registry.add(std::string("aten::") + base, resolve);
    registry.add(std::string("aten::") + base + "_", resolve);
  }
  for (const char* name : kUnaryWithArgs) registry.add(name, resolve);
  for (const char* name : kBinaryOps) registry.add(name, resolve);
  for (const char* name : kMoreElementwise) registry.add(name, resolve);
  // Partial-keeping policies (Note [Partial through pointwise]) replace `resolve` where they apply.
  const std::pair<PartialPolicy, std::vector<std::string>> policies[] = {
      {PartialPolicy::LinearUnary, {"aten::neg", "aten::neg_", "aten::clone", "aten::mul.Scalar", "aten::mul_.Scalar",
                                    "aten::div.Scalar", "aten::div_.Scalar", "aten::_conj_physical", "aten::conj_physical_"}},
      {PartialPolicy::NonDecreasing,
       {"aten::relu", "aten::relu_", "aten::sigmoid", "aten::sigmoid_", "aten::tanh", "aten::tanh_", "aten::exp",
        "aten::exp_", "aten::exp2", "aten::exp2_", "aten::expm1", "aten::expm1_", "aten::floor", "aten::floor_",
        "aten::ceil", "aten::ceil_", "aten::trunc", "aten::trunc_", "aten::round", "aten::round_", "aten::sign",
        "aten::sign_", "aten::erf", "aten::erf_", "aten::atan", "aten::atan_", "aten::sinh", "aten::sinh_",
        "aten::clamp", "aten::clamp_", "aten::clamp_min", "aten::clamp_min_", "aten::clamp_max", "aten::clamp_max_",
        "aten::hardtanh", "aten::hardtanh_", "aten::nan_to_num", "aten::nan_to_num_"}},
      {PartialPolicy::Additive, {"aten::add.Tensor", "aten::add_.Tensor", "aten::sub.Tensor", "aten::sub_.Tensor",
                                 "aten::add.Scalar", "aten::add_.Scalar", "aten::sub.Scalar", "aten::sub_.Scalar"}},
      {PartialPolicy::NegatedSelf, {"aten::rsub.Tensor", "aten::rsub.Scalar"}},
      {PartialPolicy::Product, {"aten::mul.Tensor", "aten::mul_.Tensor"}},
      {PartialPolicy::Quotient, {"aten::div.Tensor", "aten::div_.Tensor"}},
      {PartialPolicy::LatticeMax, {"aten::maximum"}},
      {PartialPolicy::LatticeMin, {"aten::minimum"}},
      {PartialPolicy::Select, {"aten::where.self", "aten::masked_fill.Scalar", "aten::masked_fill_.Scalar",
                               "aten::masked_fill.Tensor", "aten::masked_fill_.Tensor"}},
      {PartialPolicy::Overwrite, {"aten::copy_", "aten::fill_.Scalar", "aten::fill_.Tensor"}},
      {PartialPolicy::AnyPartial, {"aten::zero_"}},
  };
  for (const auto& [policy, names] : policies)
    for (const std::string& name : names) registry.add(name, with_policy(policy));
  for (const char* name : {"aten::zeros_like", "aten::ones_like", "aten::empty_like", "aten::full_like"})
    registry.add(name, like_factory);
  for (const char* name : {"aten::new_zeros", "aten::new_ones", "aten::new_empty", "aten::new_full", "aten::new_empty_strided"})
    registry.add(name, new_factory);
  // Every rule above computes position by position and copies the lead's placements.
  for (const char* base : kUnaryOps) {
    registry.carry_order(std::string("aten::") + base);
    registry.carry_order(std::string("aten::") + base + "_");
  }
  for (const char* name : kUnaryWithArgs) registry.carry_order(name);
  for (const char* name : kBinaryOps) registry.carry_order(name);
  for (const char* name : kMoreElementwise) registry.carry_order(name);
  for (const auto& [policy, names] : policies)
    for (const std::string& name : names) registry.carry_order(name);
  for (const char* name : {"aten::zeros_like", "aten::ones_like", "aten::empty_like", "aten::full_like", "aten::new_zeros",
                           "aten::new_ones", "aten::new_empty", "aten::new_full", "aten::new_empty_strided"})
    registry.carry_order(name);
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
