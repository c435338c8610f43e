// Random operators, sharding-invariant: the in-place fills (uniform_, normal_, bernoulli_,
// exponential_, ...), bernoulli, multinomial, and native_dropout with its backward.
//
// Every element's random value comes from a counter-based generator (util/counter_random.h)
// keyed by the element's GLOBAL position and a per-call key that every rank draws in the
// same order: with the same shardtensor::manual_seed, a dropout mask is the same whatever the
// mesh, the placements or the shard sizes, and no rank communicates. Replicated copies draw
// the same values, so they stay replicated. (The values differ from libtorch's own CPU
// generator: the same seed does not reproduce a plain-tensor run.)
#include "rules/helpers.h"
#include "rules/random.h"
#include "util/strings.h"

namespace shardtensor {
namespace {

void refuse_generator(const OpMeta& op) {
  TORCH_CHECK(!op.has_arg("generator") || op.arg("generator").isNone(), op.name, ": a torch Generator cannot be used with ShardTensors; they draw from a ",
              "counter-based stream indexed by global position, seeded with shardtensor::manual_seed().");
}

// uniform_(self, from, to, generator?), normal_(self, mean, std, generator?),
// bernoulli_.float(self, p, generator?): self's piece filled in place.
// The parameter checks torch makes on one process, made here on every rank before any draw.
void check_parameters(const OpMeta& op, Draw kind) {
  auto value = [&](const char* name) { return number_arg(op, name); };
  switch (kind) {
    case Draw::Exponential:
      TORCH_CHECK(value("lambd") > 0, op.name, " expects lambda > 0.0, but found lambda=", value("lambd"));
      break;
    case Draw::LogNormal: TORCH_CHECK(value("std") > 0, op.name, " expects std > 0.0, but found std=", value("std")); break;
    case Draw::Geometric:
      TORCH_CHECK(value("p") > 0 && value("p") < 1, op.name, " expects p to be in (0, 1), but got p=", value("p"));
      break;
    default: break;
  }
}

template <Draw Kind>
RuleResult fill_random_rule(const OpMeta& op) {
  refuse_generator(op);
  check_parameters(op, Kind);
  const ShardTensorSpec self = without_partial(op.inputs[0].spec);  // a fresh value is not a pending sum
  RuleResult r;
  r.input_targets = {self};
  r.outputs = {layout_of(self)};
  r.kernel_plan = declare(RandomFillPlan(Kind, self));
  return r;
}

// The largest value random_ draws for `dtype` when it is given no upper bound, plus one: every
// integer a floating type holds exactly (2^digits, inclusive, as torch), the type's maximum
// for integral types.
double random_upper_bound(c10::ScalarType dtype) {
  switch (dtype) {
    case c10::kBool: return 2;
    case c10::kByte: return 256;
    case c10::kChar: return 128;
    case c10::kShort: return 32768;
    case c10::kInt: return 2147483648.0;
    case c10::kLong: return 9223372036854775808.0;
    case c10::kHalf: return 2049;
    case c10::kBFloat16: return 257;
    case c10::kFloat: return 16777217;
    default: return 9007199254740993.0;  // double: 2^53 + 1
  }
}

// random_(self, generator?), random_.to(self, to, generator?), random_.from(self, from, to?,
// generator?): integers in [from, to), from 0 and up to the type's range where not given.
RuleResult random_integers_rule(const OpMeta& op) {
  refuse_generator(op);
  const ShardTensorSpec self = without_partial(op.inputs[0].spec);
  const bool has_from = op.has_arg("from"), has_to = op.has_arg("to");
  const double low = has_from ? static_cast<double>(int_arg(op, "from")) : 0;
  const std::optional<int64_t> to = has_to ? optional_int_arg(op, "to") : std::nullopt;
  const double high = to ? static_cast<double>(*to) : random_upper_bound(self.dtype());
  TORCH_CHECK(low < high, op.name, ": 'from' (", low, ") must be less than 'to' (", high, ").");
  RuleResult r;
  r.input_targets = {self};
  r.outputs = {layout_of(self)};
  r.kernel_plan = declare(RandomFillPlan(Draw::Integers, self, low, high));
  return r;
}

// rand_like / randn_like / randint_like: see RandomLikePlan.
template <Draw Kind>
RuleResult random_like_rule(const OpMeta& op) {
  refuse_generator(op);
  const ShardTensorSpec& in = op.inputs[0].spec;
  const ShardTensorSpec layout = without_partial(in);  // fresh values are not a pending sum
  double low = 0, high = 0;
  if (Kind == Draw::Integers) {
    low = op.has_arg("low") ? static_cast<double>(int_arg(op, "low")) : 0;
    high = static_cast<double>(int_arg(op, "high"));
    TORCH_CHECK(low < high, op.name, ": random_ expects 'from' to be less than 'to', but got from=", low, " >= to=", high);
  }
  RuleResult r;
  r.input_targets = {in};
  r.outputs = {layout_of(layout)};
  r.kernel_plan = declare(RandomLikePlan(Kind, layout, low, high));
  return r;
}

// bernoulli(self), bernoulli.p(self, p), bernoulli_.Tensor(self, p): see BernoulliPlan.
template <BernoulliPlan::Form Form>
RuleResult bernoulli_rule(const OpMeta& op) {
  refuse_generator(op);
  const ShardTensorSpec self = without_partial(op.inputs[0].spec);  // probabilities are not a pending sum
  RuleResult r;
  r.outputs = {layout_of(self)};
  switch (Form) {
    case BernoulliPlan::Form::ProbabilitiesInSelf:
      r.input_targets = {self};
      r.kernel_plan = declare(BernoulliPlan(Form, self, false, sharding_mesh_dims(self)));
      break;
    case BernoulliPlan::Form::ScalarP: {
      const double p = number_arg(op, "p");
      TORCH_CHECK(p >= 0 && p <= 1, op.name, " expects p to be in [0, 1], but got p=", p);
      r.input_targets = {self};
      r.kernel_plan = declare(BernoulliPlan(Form, self, false, {}));
      break;
    }
    case BernoulliPlan::Form::InPlaceTensorP: {
      const ShardTensorSpec& p = op.inputs[1].spec;
      const bool broadcasts = p.shape() != self.shape();
      const ShardTensorSpec p_target = broadcasts ? replicated(p) : align_to(without_partial(p), self);
      r.input_targets = {self, p_target};
      r.kernel_plan = declare(BernoulliPlan(Form, self, broadcasts, sharding_mesh_dims(p_target)));
      break;
    }
  }
  return r;
}

// multinomial(self, num_samples, replacement=False, generator?): see MultinomialPlan. torch's
// argument checks first, on every rank.
RuleResult multinomial_rule(const OpMeta& op) {
  refuse_generator(op);
  const ShardTensorSpec& in = op.inputs[0].spec;
  TORCH_CHECK(in.ndim() == 1 || in.ndim() == 2, op.name, ": prob_dist must be 1 or 2 dim, got ", in.ndim(), " dims (shape [",
              join(in.shape(), ", "), "]).");
  const int64_t n = int_arg(op, "num_samples");
  const bool replacement = bool_arg(op, "replacement");
  const int64_t categories = in.shape().back();
  TORCH_CHECK(n > 0, op.name, ": cannot sample n_sample <= 0 samples (num_samples=", n, ").");
  TORCH_CHECK(replacement || n <= categories, op.name, ": cannot sample n_sample > prob_dist.size(-1) samples without ",
              "replacement (num_samples=", n, ", ", categories, " categories).");
  const ShardTensorSpec probabilities = replicate_tensor_dims(without_partial(in), {in.ndim() - 1});
  RuleResult r;
  r.input_targets = {probabilities};
  r.outputs = {layout_of(probabilities)};  // rows as the input's, the samples dim whole
  r.kernel_plan = declare(MultinomialPlan(probabilities, n, replacement, sharding_mesh_dims(probabilities)));
  return r;
}

// native_dropout(input, p, train?) -> (output, mask): output = input * mask / (1 - p), linear
// in input, so a Partial input stays Partial; the mask is never Partial.
RuleResult native_dropout_rule(const OpMeta& op) {
  const ShardTensorSpec& in = op.inputs[0].spec;
  const ShardTensorSpec whole = without_partial(in);
  RuleResult r;
  r.input_targets = {in};
  r.outputs = {layout_of(in), layout_of(whole)};
  r.kernel_plan = declare(DropoutPlan(whole));
  return r;
}

// native_dropout_backward(grad_output, mask, scale): pointwise, linear in the gradient.
RuleResult native_dropout_backward_rule(const OpMeta& op) {
  const ShardTensorSpec grad = without_partial(op.inputs[0].spec);
  RuleResult r;
  r.input_targets = {grad, align_to(op.inputs[1].spec, grad)};
  r.outputs = {layout_of(grad)};
  return r;
}

}  // namespace

std::string RandomFillPlan::name() const {
  switch (kind) {
    case Draw::Uniform: return "counter-based uniform fill";
    case Draw::Normal: return "counter-based normal fill";
    case Draw::Bernoulli: return "counter-based bernoulli fill";
    case Draw::Exponential: return "counter-based exponential fill";
    case Draw::LogNormal: return "counter-based log-normal fill";
    case Draw::Cauchy: return "counter-based Cauchy fill";
    case Draw::Geometric: return "counter-based geometric fill";
    case Draw::Integers: return "counter-based integer fill";
  }
  return "counter-based fill";
}

void register_random_rules(RuleRegistry& registry) {
  registry.add("aten::uniform_", fill_random_rule<Draw::Uniform>);
  registry.add("aten::normal_", fill_random_rule<Draw::Normal>);
  registry.add("aten::bernoulli_.float", fill_random_rule<Draw::Bernoulli>);
  registry.add("aten::bernoulli", bernoulli_rule<BernoulliPlan::Form::ProbabilitiesInSelf>);
  registry.add("aten::bernoulli.p", bernoulli_rule<BernoulliPlan::Form::ScalarP>);
  registry.add("aten::bernoulli_.Tensor", bernoulli_rule<BernoulliPlan::Form::InPlaceTensorP>);
  registry.add("aten::multinomial", multinomial_rule);
  registry.add("aten::rand_like", random_like_rule<Draw::Uniform>);
  registry.add("aten::randn_like", random_like_rule<Draw::Normal>);
  registry.add("aten::randint_like", random_like_rule<Draw::Integers>);
  registry.add("aten::randint_like.low_dtype", random_like_rule<Draw::Integers>);
  registry.add("aten::exponential_", fill_random_rule<Draw::Exponential>);
  registry.add("aten::log_normal_", fill_random_rule<Draw::LogNormal>);
  registry.add("aten::cauchy_", fill_random_rule<Draw::Cauchy>);
  registry.add("aten::geometric_", fill_random_rule<Draw::Geometric>);
  registry.add("aten::random_", random_integers_rule);
  registry.add("aten::random_.to", random_integers_rule);
  registry.add("aten::random_.from", random_integers_rule);
  registry.add("aten::native_dropout", native_dropout_rule);
  registry.add("aten::native_dropout_backward", native_dropout_backward_rule);
}

}  // namespace shardtensor
