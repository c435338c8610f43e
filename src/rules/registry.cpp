// RuleRegistry, OpMeta's accessors, the public registration API, and the explicit list of
// rule families. No static registrars: a family is registered because it is named here.
#include "rules/registry.h"

#include <ATen/core/function_schema.h>

#include <algorithm>

namespace shardtensor {

RuleResult RuleResult::unsupported(std::string reason) {
  RuleResult r;
  r.unsupported_reason = std::move(reason);
  return r;
}

const TensorInput* OpMeta::input_at(size_t arg_index) const {
  for (const TensorInput& in : inputs)
    if (in.arg_index == arg_index) return &in;
  return nullptr;
}

size_t OpMeta::arg_index(const std::string& arg_name) const {
  TORCH_CHECK(schema, name, ": no schema to look argument '", arg_name, "' up in");
  const c10::optional<int> index = schema->argumentIndexWithName(arg_name);
  if (!index) {
    std::string names;
    for (const c10::Argument& a : schema->arguments()) names += (names.empty() ? "" : ", ") + a.name();
    TORCH_CHECK(false, name, " has no argument named '", arg_name, "'; its arguments are (", names, ")");
  }
  return static_cast<size_t>(*index);
}

bool OpMeta::has_arg(const std::string& arg_name) const { return schema && schema->argumentIndexWithName(arg_name).has_value(); }

const c10::IValue& OpMeta::arg(const std::string& arg_name) const {
  const size_t index = arg_index(arg_name);
  TORCH_CHECK(index < args.size(), name, ": argument '", arg_name, "' is number ", index, " in the schema, but the call has ",
              args.size(), " arguments");
  return args[index];
}

const TensorInput* OpMeta::input_named(const std::string& arg_name) const { return input_at(arg_index(arg_name)); }

int64_t OpMeta::input_position(size_t arg_index) const {
  for (size_t i = 0; i < inputs.size(); ++i)
    if (inputs[i].arg_index == arg_index) return static_cast<int64_t>(i);
  return -1;
}

bool OpMeta::is_inplace() const {
  if (!schema || schema->arguments().empty()) return false;
  const c10::AliasInfo* alias = schema->arguments()[0].alias_info();
  return alias && alias->isWrite() && !inputs.empty() && inputs[0].arg_index == 0;
}

void RuleRegistry::add(const std::string& op_name, Rule rule) {
  rules_[op_name] = std::move(rule);
  carrying_.erase(op_name);
  ++generation_;
}

void RuleRegistry::carry_order(const std::string& op_name) {
  TORCH_INTERNAL_ASSERT(rules_.count(op_name), "carry_order: no rule for ", op_name);
  carrying_.insert(op_name);
  ++generation_;
}

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
void register_all_rules(RuleRegistry& registry) {
  register_view_rules(registry);
  register_pointwise_rules(registry);
  register_reduction_rules(registry);
  register_matmul_rules(registry);
  register_normalization_rules(registry);
  register_loss_rules(registry);
  register_embedding_rules(registry);
  register_convolution_rules(registry);
  register_pooling_rules(registry);
  register_resampling_rules(registry);
  register_spatial_norm_rules(registry);
  register_random_rules(registry);
  register_indexing_rules(registry);
  register_attention_rules(registry);
  register_scan_rules(registry);
  register_dtype_view_rules(registry);
  register_comparison_rules(registry);
  register_linalg_rules(registry);
}
}  // namespace

RuleRegistry& rule_registry() {
  // A function-local static: every propagation lookup asks for the generation, and the static's
  // guard is one inline check where std::call_once was a library call each time.
  static RuleRegistry registry = [] {
    RuleRegistry filled;
    register_all_rules(filled);
    return filled;
  }();
  return registry;
}

void register_sharding_rule(const std::string& op_name, Rule rule) {
  TORCH_CHECK(op_name.find("::") != std::string::npos, "register_sharding_rule: '", op_name,
              "' is not a qualified operator name; write it as 'namespace::name' or 'namespace::name.overload'.");
  TORCH_CHECK(rule, "register_sharding_rule: the rule for '", op_name, "' is empty.");
  rule_registry().add(op_name, std::move(rule));
}

std::vector<std::string> sharding_rule_names() { return rule_registry().op_names(); }

}  // namespace shardtensor
