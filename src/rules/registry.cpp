// RuleRegistry and the explicit list of rule families. No static registrars: a family is
// registered because it is named here.
#include "rules/registry.h"

#include <algorithm>
#include <mutex>

namespace shardtensor {

RuleResult RuleResult::unsupported(std::string reason) {
  RuleResult r;
  r.unsupported_reason = std::move(reason);
  return r;
}

void RuleRegistry::add(const std::string& op_name, Rule rule) { rules_[op_name] = std::move(rule); }

const Rule* RuleRegistry::find(const std::string& op_name) const {
  auto it = rules_.find(op_name);
  return it == rules_.end() ? nullptr : &it->second;
}

std::vector<std::string> RuleRegistry::op_names() const {
  std::vector<std::string> names;
  for (const auto& entry : rules_) names.push_back(entry.first);
  std::sort(names.begin(), names.end());
  return names;
}

namespace {
void register_all_rules(RuleRegistry& registry) { register_view_rules(registry); }
}  // namespace

RuleRegistry& rule_registry() {
  static RuleRegistry registry;
  static std::once_flag once;
  std::call_once(once, [] { register_all_rules(registry); });
  return registry;
}

}  // namespace shardtensor
