// is_same_size and equal compare global tensors, which no rank holds: is_same_size is answered
// from the specs; equal compares pieces laid out alike (Partials resolved, the second operand
// moved to the first's layout) and combines the ranks' answers (comparison.h).
#include "rules/comparison.h"

#include "rules/helpers.h"

namespace shardtensor {
namespace {

RuleResult answered(const OpMeta& op, bool answer) {
  RuleResult r;
  for (const TensorInput& in : op.inputs) r.input_targets.push_back(in.spec);
  r.kernel_plan = declare(KnownAnswerPlan(answer));
  return r;
}

RuleResult is_same_size_rule(const OpMeta& op) {
  return answered(op, op.inputs[0].spec.shape() == op.inputs[1].spec.shape());
}

RuleResult equal_rule(const OpMeta& op) {
  const ShardTensorSpec &a = op.inputs[0].spec, &b = op.inputs[1].spec;
  if (a.shape() != b.shape()) return answered(op, false);
  const ShardTensorSpec lead = without_partial(a);
  RuleResult r;
  r.input_targets = {lead, align_to(b, lead)};
  std::vector<int64_t> sharding = sharding_mesh_dims(lead);
  if (sharding.empty()) return r;  // every rank holds both whole: the local answer is the answer
  r.kernel_plan = declare(GlobalEqualPlan(lead.mesh(), std::move(sharding)));
  return r;
}

}  // namespace

void register_comparison_rules(RuleRegistry& registry) {
  registry.add("aten::is_same_size", is_same_size_rule);
  registry.add("aten::equal", equal_rule);
}

}  // namespace shardtensor
