// View rules. For now the views that keep the layout exactly (detach, alias): the output has
// the input's spec and no input moves. Shape-changing views come with the dispatch issue (#4).
#include "rules/registry.h"

namespace shardtensor {
namespace {

RuleResult same_layout_view(const OpMeta& op) {
  if (op.inputs.size() != 1) return RuleResult::unsupported("expects exactly one ShardTensor input");
  RuleResult r;
  r.input_targets = {op.inputs[0]};
  r.output_specs = {op.inputs[0]};
  return r;
}

}  // namespace

void register_view_rules(RuleRegistry& registry) {
  for (const char* name : {"aten::detach", "aten::alias"}) registry.add(name, same_layout_view);
}

}  // namespace shardtensor
