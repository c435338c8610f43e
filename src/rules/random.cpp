// Random operators, sharding-invariant: uniform_, normal_, bernoulli_ (what dropout
// decomposes into on CPU-like devices) and native_dropout with its backward.
//
// Every element's random value comes from a counter-based generator (util/counter_random.h)
// keyed by the element's GLOBAL position and a per-call key that every rank draws in the
// same order: with the same shardtensor::manual_seed, a dropout mask is the same whatever the
// mesh, the placements or the shard sizes, and no rank communicates. Replicated copies draw
// the same values, so they stay replicated. (The values differ from libtorch's own CPU
// generator: the same seed does not reproduce a plain-tensor run.)
#include "rules/helpers.h"
#include "rules/random.h"

namespace shardtensor {
namespace {

void refuse_generator(const OpMeta& op) {
  TORCH_CHECK(op.arg("generator").isNone(), op.name, ": a torch Generator cannot be used with ShardTensors; they draw from a ",
              "counter-based stream indexed by global position, seeded with shardtensor::manual_seed().");
}

// uniform_(self, from, to, generator?), normal_(self, mean, std, generator?),
// bernoulli_.float(self, p, generator?): self's piece filled in place.
template <Draw Kind>
RuleResult fill_random_rule(const OpMeta& op) {
  refuse_generator(op);
  const ShardTensorSpec self = without_partial(op.inputs[0].spec);  // a fresh value is not a pending sum
  RuleResult r;
  r.input_targets = {self};
  r.outputs = {layout_of(self)};
  r.kernel_plan = declare(RandomFillPlan(Kind, self));
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
  }
  return "counter-based fill";
}

void register_random_rules(RuleRegistry& registry) {
  registry.add("aten::uniform_", fill_random_rule<Draw::Uniform>);
  registry.add("aten::normal_", fill_random_rule<Draw::Normal>);
  registry.add("aten::bernoulli_.float", fill_random_rule<Draw::Bernoulli>);
  registry.add("aten::native_dropout", native_dropout_rule);
  registry.add("aten::native_dropout_backward", native_dropout_backward_rule);
}

}  // namespace shardtensor
